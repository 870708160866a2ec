"""Chat templates: a conversation (:class:`~inferctl.contract.openai.ChatMessage` list) → one
prompt string.

Three kinds:

- a model's own Jinja template (GGUF ``tokenizer.chat_template``, Hugging Face's
  ``chat_template``), or one given with ``--chat-template`` (a file path or the template text,
  as vLLM's flag), rendered as transformers' ``apply_chat_template`` does: Jinja2's
  ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``, variables
  ``messages`` (``[{"role", "content"}]``), ``add_generation_prompt=True``, ``bos_token``,
  ``eos_token``, and a ``raise_exception(msg)`` function (:class:`JinjaChatTemplate`);
- ``"plain"``, for the tiny story models (stories260K, the demo model) trained on plain text
  with no roles: the text of the messages in order joined with a newline, no role markers; a
  single user message ``"Once upon a time"`` becomes exactly the prompt ``"Once upon a
  time"``, so chat and completions agree for greedy decoding;
- ``"roles"`` (``"System: …\\nUser: …\\nAssistant:"``) for models that know turns but ship no
  template.

:func:`resolve_chat_template` picks one at server start (the flag wins, then the model's
template, then "plain") and compiles and test-renders it there, so a bad template is an error
at start, not on every request.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from inferctl.contract.errors import APIError
from inferctl.contract.openai import ChatMessage

#: The built-in template names ``render_chat_prompt`` knows (``--chat-template``).
CHAT_TEMPLATES = ("plain", "roles")

_ROLE_NAMES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}

#: The conversation a template is test-rendered with at start.
_PROBE = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Hello"}]


class ChatTemplateError(ValueError):
    """A template that cannot be read, compiled or rendered (message names the template source)."""


class JinjaChatTemplate:
    """A compiled Jinja chat template.

    ``source``: the template text; ``origin``: where it came from (for messages: "the model's
    metadata", a file path, "--chat-template"); ``bos_token``/``eos_token``: the strings the
    template sees as ``bos_token``/``eos_token``. Raises :class:`ChatTemplateError` on a
    syntax error (naming ``origin`` and the line).
    """

    def __init__(self, source: str, origin: str, bos_token: str = "", eos_token: str = ""):
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):  # noqa: ANN001
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        # transformers' _compile_jinja_template: these options, loopcontrols, tojson, strftime_now
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except TemplateError as e:
            line = getattr(e, "lineno", None)
            raise ChatTemplateError(f"chat template from {origin}: {type(e).__name__}"
                                    f"{f' at line {line}' if line else ''}: {e}") from e
        self.source = source
        self.origin = origin
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render_dicts(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render ``[{"role", "content"}]``. Raises :class:`ChatTemplateError` with the
        template's own message (``raise_exception``), the Jinja error, or any other error the
        template program raised on these messages (``1 + 'a'``, ``range(10**6)`` past the
        sandbox's MAX_RANGE, runaway macro recursion), named by its type."""
        from jinja2 import TemplateError

        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token)
        except TemplateError as e:
            raise ChatTemplateError(f"chat template from {self.origin}: {e}") from e
        except Exception as e:   # noqa: BLE001 - the template is a program: its failure is the request's
            raise ChatTemplateError(f"chat template from {self.origin}: {type(e).__name__}: {e}") from e

    def render(self, messages: list[ChatMessage], add_generation_prompt: bool = True) -> str:
        """Render API messages (``developer`` is passed as ``system``; content parts joined)."""
        return self.render_dicts([{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                                  for m in messages], add_generation_prompt)

    def check(self) -> None:
        """Test-render a system + user conversation; raises :class:`ChatTemplateError` (also
        when it renders to nothing: every chat request would be refused)."""
        if not self.render_dicts(list(_PROBE)).strip():
            raise ChatTemplateError(f"chat template from {self.origin}: renders a system + user conversation "
                                    "to an empty prompt")


ChatTemplate = str | JinjaChatTemplate


def resolve_chat_template(flag: str | None, model_template: str | None = None, *, bos_token: str = "",
                          eos_token: str = "") -> ChatTemplate:
    """The template a server uses, compiled and test-rendered.

    ``flag`` (``--chat-template``): None → ``model_template`` if the model has one, else
    "plain"; a built-in name ("plain", "roles"); the path of a file holding a Jinja template;
    or the Jinja template text itself (recognised by ``{{`` or ``{%``), as vLLM's flag.
    Raises :class:`ChatTemplateError` (a ValueError) for a flag that is none of these or a
    template that does not compile or render.
    """
    if flag is None:
        if not model_template:
            return "plain"
        tpl = JinjaChatTemplate(model_template, "the model's metadata", bos_token, eos_token)
    elif flag in CHAT_TEMPLATES:
        return flag
    elif "{{" in flag or "{%" in flag:
        tpl = JinjaChatTemplate(flag, "--chat-template", bos_token, eos_token)
    else:
        p = Path(flag)
        if not p.is_file():
            raise ChatTemplateError(f"--chat-template: {flag!r} is neither {' nor '.join(CHAT_TEMPLATES)}, "
                                    "a readable file, nor a Jinja template")
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ChatTemplateError(f"--chat-template: cannot read {p}: {e}") from e
        tpl = JinjaChatTemplate(text, str(p), bos_token, eos_token)
    tpl.check()
    return tpl


def check_chat_template(template: ChatTemplate) -> None:
    """ValueError for an unknown built-in name; a :class:`JinjaChatTemplate` is test-rendered."""
    if isinstance(template, JinjaChatTemplate):
        template.check()
    elif template not in CHAT_TEMPLATES:
        raise ValueError(f"unknown chat template {template!r}; known: {', '.join(CHAT_TEMPLATES)}")


def render_chat_prompt(messages: list[ChatMessage], template: ChatTemplate = "plain") -> str:
    """Render chat messages into one prompt string.

    ``"plain"`` (default, for the plain-text story models): the non-empty message texts in
    order joined by ``"\\n"``, no role markers. ``"roles"``: ``"System: …\\nUser: …\\n
    Assistant: …\\nAssistant:"`` — each message on its own line prefixed by its role, ending
    with an open assistant turn. A :class:`JinjaChatTemplate`: rendered with
    ``add_generation_prompt=True``; a template's ``raise_exception`` (e.g. roles that do not
    alternate), any other error it raises, or an empty rendering is an
    :class:`~inferctl.contract.errors.APIError` 400 naming ``messages``.
    Raises ValueError for an unknown template name.
    """
    if isinstance(template, JinjaChatTemplate):
        try:
            prompt = template.render(messages)
        except ChatTemplateError as e:
            raise APIError(400, str(e), param="messages", code="chat_template") from e
        if not prompt.strip():   # generating from nothing would answer a question nobody asked
            raise APIError(400, f"chat template from {template.origin}: these messages render to an empty "
                                "prompt (the template keeps none of them)", param="messages", code="chat_template")
        return prompt
    if template == "plain":
        return "\n".join(m.text() for m in messages if m.text() != "")
    if template == "roles":
        lines = [f"{_ROLE_NAMES[m.role]}: {m.text()}" for m in messages]
        return "\n".join(lines + ["Assistant:"])
    raise ValueError(f"unknown chat template {template!r}; known: {', '.join(CHAT_TEMPLATES)}")
