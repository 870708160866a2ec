"""YAML configuration text → Python data, refusing what ``yaml.safe_load`` lets pass silently.

PyYAML keeps the last of two equal keys in one mapping (``rate_limits:`` written twice: the
first block vanishes without a word), although YAML 1.2 requires keys to be unique
(https://yaml.org/spec/1.2.2/#mapping, "The content of a mapping node is an unordered set of
key/value node pairs, with the restriction that each of the keys is unique"); and a document
nested thousands deep ends in ``RecursionError``. :func:`load_yaml` turns both into
``ValueError`` naming the line.
"""

from __future__ import annotations

from typing import Any

import yaml


def _first_duplicate(root: yaml.Node) -> tuple[str, int] | None:
    """The first key written twice in one mapping of ``root`` as (key, 1-based line), or None."""
    stack, seen_nodes = [root], set()
    while stack:
        node = stack.pop()
        if id(node) in seen_nodes:   # aliases point at a node already walked
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: set = set()
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    ident = (key.tag, key.value)
                    if ident in keys:
                        return key.value, key.start_mark.line + 1
                    keys.add(ident)
                stack.extend((key, value))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return None


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)`` that refuses a duplicate mapping key and deep nesting.

    Raises:
        ValueError: a key written twice in one mapping (``duplicate key 'rate_limits' at line
            4``), nesting too deep to parse, or invalid YAML (the parser's first line).
    """
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        dup = None if node is None else _first_duplicate(node)
        if dup is not None:
            raise ValueError(f"duplicate key {dup[0]!r} at line {dup[1]} (each key once per mapping)")
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"not valid YAML ({str(exc).splitlines()[0]})") from None
    except RecursionError:
        raise ValueError("nested too deeply to parse") from None
