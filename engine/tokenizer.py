"""Tokenizers behind one interface: llama2.c ``tokenizer.bin``, Hugging Face ``tokenizer.json``, bytes.

Interface (duck-typed, see :class:`BaseTokenizer`)::

    encode(text: str, bos: bool = True) -> list[int]
    decode(ids: list[int]) -> str          # full id list; BOS/EOS skipped
    id_to_piece(i: int) -> str
    bos_id, eos_id, vocab_size, name

Decoding joins each token's bytes and decodes UTF-8 with ``errors="replace"``, so decoding
growing prefixes of an id list is a valid incremental detokenizer: a multi-byte character
split across byte-fallback tokens shows as U+FFFD at the end of a prefix until its last byte
arrives (an incremental detokenizer should hold back a trailing U+FFFD). Like llama2.c
(``run.c`` ``decode``), the dummy-prefix space of the first piece after BOS is dropped; a list
that does not start with BOS keeps its leading space, so continuation text can be appended.
"""

from __future__ import annotations

import heapq
import json
import re
import struct
from pathlib import Path

_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


class BaseTokenizer:
    """Shared decode over a per-id byte table. Subclasses fill ``_piece_bytes`` and ids."""

    name: str = "base"
    bos_id: int = 1
    eos_id: int = 2
    vocab_size: int = 0
    add_dummy_prefix: bool = False

    def __init__(self) -> None:
        self._piece_bytes: list[bytes] = []
        self._skip: set[int] = set()

    def encode(self, text: str, bos: bool = True) -> list[int]:  # pragma: no cover - abstract
        raise NotImplementedError

    def id_to_piece(self, i: int) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def token_bytes(self, i: int) -> bytes:
        """The bytes token ``i`` stands for (byte-fallback pieces are their byte). ValueError if out of range."""
        if not 0 <= i < self.vocab_size:
            raise ValueError(f"token id {i} out of range [0, {self.vocab_size})")
        return self._piece_bytes[i]

    def decode(self, ids: list[int]) -> str:
        """Text of a full id list (BOS/EOS and other control ids skipped; see module docstring).

        ValueError for an id outside ``[0, vocab_size)``. A list without BOS (or a tokenizer
        without a dummy prefix) joins the ids' bytes from a table with control ids as b"" (the
        detokenizer's per-token call, ~2x faster than the loop); otherwise the loop below."""
        if not ids:
            return ""
        if not (self.add_dummy_prefix and self.bos_id in ids) and min(ids) >= 0 and max(ids) < self.vocab_size:
            table = self.__dict__.get("_decode_bytes")
            if table is None:
                table = self._decode_bytes = [b"" if i in self._skip else b
                                              for i, b in enumerate(self._piece_bytes[:self.vocab_size])]
            return b"".join([table[i] for i in ids]).decode("utf-8", errors="replace")
        out = bytearray()
        prev = None
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} out of range [0, {self.vocab_size})")
            if i in self._skip:
                prev = i
                continue
            b = self._piece_bytes[i]
            if prev == self.bos_id and self.add_dummy_prefix and b[:1] == b" ":
                b = b[1:]
            out += b
            prev = i
        return out.decode("utf-8", errors="replace")


class Llama2cTokenizer(BaseTokenizer):
    """llama2.c tokenizer file: uint32 max_token_length, then per token float32 score, int32
    length, bytes (``tokenizer.bin``, ``tok512.bin``).

    Encoding follows llama2.c ``encode()``: optional BOS, a dummy-prefix " " token for
    non-empty text, each UTF-8 code point looked up in the vocabulary or else byte fallback
    ``<0xXX>`` = id 3 + byte, then repeatedly merge the adjacent pair whose concatenation is
    in the vocabulary with the highest score (leftmost on ties). Implemented with a heap and
    a linked list (O(n log n)) instead of llama2.c's O(n²) rescans, same result.

    Raises FileNotFoundError if ``path`` is missing and ValueError (naming the path and the
    offset) for a truncated or malformed file.
    """

    def __init__(self, path: str | Path, vocab_size: int | None = None):
        super().__init__()
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"llama2.c tokenizer not found: {p}")
        data = p.read_bytes()
        if len(data) < 4:
            raise ValueError(f"{p}: too short for a llama2.c tokenizer header ({len(data)} bytes)")
        (self.max_token_length,) = struct.unpack_from("<I", data, 0)
        off = 4
        pieces: list[bytes] = []
        scores: list[float] = []
        while off < len(data) and (vocab_size is None or len(pieces) < vocab_size):
            if off + 8 > len(data):
                raise ValueError(f"{p}: truncated token record at byte {off} (token {len(pieces)})")
            score, n = struct.unpack_from("<fi", data, off)
            off += 8
            if n < 0 or off + n > len(data):
                raise ValueError(f"{p}: token {len(pieces)} has invalid length {n} at byte {off - 4}")
            pieces.append(data[off:off + n])
            scores.append(score)
            off += n
        if vocab_size is not None and len(pieces) != vocab_size:
            raise ValueError(f"{p}: holds {len(pieces)} tokens, model vocab_size is {vocab_size}")
        if len(pieces) < 259:
            raise ValueError(f"{p}: {len(pieces)} tokens; a llama2.c vocabulary needs >= 259 (3 control + 256 bytes)")
        self.path = p
        self.name = p.stem
        self.pieces = pieces
        self.scores = scores
        self.vocab_size = len(pieces)
        self.bos_id, self.eos_id, self.unk_id = 1, 2, 0
        self.add_dummy_prefix = True
        self._lookup: dict[bytes, int] = {}
        for i, b in enumerate(pieces):
            self._lookup.setdefault(b, i)
        self._piece_bytes = []
        for b in pieces:
            m = _BYTE_PIECE.match(b.decode("latin-1"))
            self._piece_bytes.append(bytes([int(m.group(1), 16)]) if m else b)
        self._skip = {self.bos_id, self.eos_id}

    def id_to_piece(self, i: int) -> str:
        if not 0 <= i < self.vocab_size:
            raise ValueError(f"token id {i} out of range [0, {self.vocab_size})")
        return self.pieces[i].decode("utf-8", errors="replace")

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> list[int]:
        """Token ids of ``text`` (see class docstring)."""
        ids: list[int] = []
        if text:
            sp = self._lookup.get(b" ")
            if sp is not None:
                ids.append(sp)
            for ch in text:
                b = ch.encode("utf-8", errors="surrogatepass")
                i = self._lookup.get(b)
                if i is not None:
                    ids.append(i)
                else:
                    ids.extend(3 + x for x in b)
        ids = self._merge(ids)
        if bos:
            ids.insert(0, self.bos_id)
        if eos:
            ids.append(self.eos_id)
        return ids

    def _merge(self, ids: list[int]) -> list[int]:
        n = len(ids)
        if n < 2:
            return ids
        pieces, lookup, scores = self.pieces, self._lookup, self.scores
        tok = list(ids)
        nxt = list(range(1, n + 1))
        prv = list(range(-1, n - 1))
        alive = [True] * n
        ver = [0] * n
        heap: list[tuple[float, int, int, int, int, int]] = []

        def push(i: int) -> None:
            j = nxt[i]
            if j >= n:
                return
            m = lookup.get(pieces[tok[i]] + pieces[tok[j]])
            if m is not None:
                heapq.heappush(heap, (-scores[m], i, j, ver[i], ver[j], m))

        for i in range(n - 1):
            push(i)
        while heap:
            _, i, j, vi, vj, m = heapq.heappop(heap)
            if not (alive[i] and alive[j] and nxt[i] == j and ver[i] == vi and ver[j] == vj):
                continue
            tok[i] = m
            ver[i] += 1
            alive[j] = False
            nxt[i] = nxt[j]
            if nxt[j] < n:
                prv[nxt[j]] = i
            if prv[i] >= 0:
                push(prv[i])
            push(i)
        return [tok[i] for i in range(n) if alive[i]]


class HFTokenizer(BaseTokenizer):
    """A Hugging Face ``tokenizer.json`` through the ``tokenizers`` library.

    Encoding is the library's (special tokens not added; BOS prepended here when ``bos``).
    Decoding uses a per-id byte table built from the vocabulary so that it behaves exactly
    like the llama2.c tokenizer: SentencePiece-style vocabularies ("▁" = space, ``<0xXX>``
    byte fallback) and byte-level ones (GPT-2 byte-to-unicode pieces) are both understood.
    BOS/EOS come from ``tokenizer_config.json`` / ``config.json`` beside the file when present,
    else from the pieces ``<s>``/``</s>`` or ``<|begin_of_text|>``/``<|end_of_text|>``.

    Raises FileNotFoundError for a missing file, ValueError when it cannot be parsed or no
    BOS/EOS can be found.
    """

    def __init__(self, path: str | Path, bos_id: int | None = None, eos_id: int | None = None):
        super().__init__()
        from tokenizers import Tokenizer

        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise FileNotFoundError(f"tokenizer.json not found: {p}")
        try:
            self._tok = Tokenizer.from_file(str(p))
        except Exception as e:  # the library raises a bare Exception on parse errors
            raise ValueError(f"{p}: cannot be read as a tokenizers JSON file: {e}") from e
        self.path = p
        self.name = p.parent.name or p.stem
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        spec = json.loads(p.read_text(encoding="utf-8"))
        bos_tok, eos_tok = self._special_names(p.parent)
        self.bos_id = bos_id if bos_id is not None else self._find_id(bos_tok, ["<s>", "<|begin_of_text|>", "<bos>"])
        self.eos_id = eos_id if eos_id is not None else self._find_id(
            eos_tok, ["</s>", "<|end_of_text|>", "<eos>", "<|endoftext|>"])
        if self.bos_id is None or self.eos_id is None:
            raise ValueError(f"{p}: cannot find BOS/EOS token ids (bos={self.bos_id}, eos={self.eos_id})")
        self._skip = {self.bos_id, self.eos_id}
        for t in spec.get("added_tokens", []):
            if t.get("special"):
                self._skip.add(int(t["id"]))
        byte_level = _uses_byte_level(spec)
        b2u = _bytes_to_unicode() if byte_level else None
        u2b = {v: k for k, v in b2u.items()} if b2u else None
        self._piece_bytes = []
        for i in range(self.vocab_size):
            piece = self._tok.id_to_token(i)
            if piece is None:
                self._piece_bytes.append(b"")
                continue
            if u2b is not None and i not in self._skip:
                try:
                    self._piece_bytes.append(bytes(u2b[c] for c in piece))
                    continue
                except KeyError:
                    pass
            m = _BYTE_PIECE.match(piece)
            if m and not byte_level:
                self._piece_bytes.append(bytes([int(m.group(1), 16)]))
            else:
                self._piece_bytes.append(piece.replace("\u2581", " ").encode("utf-8"))
        ids = self._tok.encode("a", add_special_tokens=False).ids
        self.add_dummy_prefix = bool(ids) and self._piece_bytes[ids[0]][:1] == b" "

    def _special_names(self, folder: Path) -> tuple[str | None, str | None]:
        bos = eos = None
        for fname in ("tokenizer_config.json", "config.json"):
            f = folder / fname
            if not f.is_file():
                continue
            try:
                cfg = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            for key, cur in (("bos_token", bos), ("eos_token", eos)):
                val = cfg.get(key)
                if isinstance(val, dict):
                    val = val.get("content")
                if isinstance(val, str) and cur is None:
                    if key == "bos_token":
                        bos = val
                    else:
                        eos = val
            if fname == "config.json":
                if bos is None and isinstance(cfg.get("bos_token_id"), int):
                    bos = self._tok.id_to_token(cfg["bos_token_id"])
                if eos is None and isinstance(cfg.get("eos_token_id"), int):
                    eos = self._tok.id_to_token(cfg["eos_token_id"])
        return bos, eos

    def _find_id(self, preferred: str | None, fallbacks: list[str]) -> int | None:
        for name in ([preferred] if preferred else []) + fallbacks:
            i = self._tok.token_to_id(name)
            if i is not None:
                return int(i)
        return None

    def id_to_piece(self, i: int) -> str:
        if not 0 <= i < self.vocab_size:
            raise ValueError(f"token id {i} out of range [0, {self.vocab_size})")
        return self._tok.id_to_token(i) or ""

    def encode(self, text: str, bos: bool = True) -> list[int]:
        ids = list(self._tok.encode(text, add_special_tokens=False).ids) if text else []
        return [self.bos_id] + ids if bos else ids


class ByteTokenizer(BaseTokenizer):
    """Bytes as tokens, for the demo model: 0 unk/pad, 1 BOS, 2 EOS, 3 + b for byte b (259 ids)."""

    def __init__(self) -> None:
        super().__init__()
        self.name = "byte"
        self.vocab_size = 259
        self.bos_id, self.eos_id = 1, 2
        self._piece_bytes = [b"", b"", b""] + [bytes([b]) for b in range(256)]
        self._skip = {0, 1, 2}

    def encode(self, text: str, bos: bool = True) -> list[int]:
        ids = [3 + b for b in text.encode("utf-8", errors="surrogatepass")]
        return [self.bos_id] + ids if bos else ids

    def id_to_piece(self, i: int) -> str:
        if not 0 <= i < self.vocab_size:
            raise ValueError(f"token id {i} out of range [0, {self.vocab_size})")
        return ["<unk>", "<s>", "</s>"][i] if i < 3 else f"<0x{i - 3:02X}>"


def _uses_byte_level(spec: dict) -> bool:
    def has(node) -> bool:
        if isinstance(node, dict):
            if node.get("type") == "ByteLevel":
                return True
            return any(has(v) for v in node.values())
        if isinstance(node, list):
            return any(has(v) for v in node)
        return False

    return has(spec.get("decoder")) or has(spec.get("pre_tokenizer"))


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable unicode map (openai/gpt-2 encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def build_hf_tokenizer_json(tok: Llama2cTokenizer) -> str:
    """A ``tokenizer.json`` (SentencePiece-BPE Llama style) equivalent to a llama2.c vocabulary.

    Pieces keep their ids (" " → "▁"; ids 0/1/2 become ``<unk>``/``<s>``/``</s>``). Merges: every
    split ``a + b`` of a piece into two pieces, ranked by the merged piece's score (highest
    first) — llama2.c merges the pair whose result scores highest, so equal ranks give equal
    merges. Normalizer Prepend("▁") + Replace(" ", "▁"), byte fallback, decoder like HF Llama.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE

    def hf_piece(i: int) -> str:
        if i == 0:
            return "<unk>"
        if i == tok.bos_id:
            return "<s>"
        if i == tok.eos_id:
            return "</s>"
        return tok.pieces[i].decode("utf-8", errors="replace").replace(" ", "\u2581")

    vocab: dict[str, int] = {}
    for i in range(tok.vocab_size):
        vocab.setdefault(hf_piece(i), i)
    merges: list[tuple[float, int, int, str, str]] = []
    for piece, i in vocab.items():
        if i < 3 or _BYTE_PIECE.match(piece):
            continue
        for k in range(1, len(piece)):
            a, b = piece[:k], piece[k:]
            if a in vocab and b in vocab:
                merges.append((-tok.scores[i], vocab[a], vocab[b], a, b))
    merges.sort()
    model = BPE(vocab=vocab, merges=[(a, b) for _, _, _, a, b in merges], unk_token="<unk>",
                byte_fallback=True, fuse_unk=True)
    t = Tokenizer(model)
    t.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(" ", 1, 0)])
    t.add_special_tokens([AddedToken("<unk>", special=True), AddedToken("<s>", special=True),
                          AddedToken("</s>", special=True)])
    t.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                     special_tokens=[("<s>", 1)])
    return t.to_str()


#: Pre-tokenizer split per ``tokenizer.ggml.pre`` (llama.cpp ``llama-vocab.cpp`` regex_exprs;
#: Hugging Face tokenizer.json of the same models). Absent → GPT-2's ByteLevel regex.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


class GGUFTokenizer(BaseTokenizer):
    """Byte-level BPE from GGUF metadata (``tokenizer.ggml.model`` = "gpt2"), built with ``tokenizers``.

    ``tokens``/``merges``/``token_types`` are ``tokenizer.ggml.tokens``/``merges``/``token_type``;
    tokens of type 3 (control, e.g. ``<|im_start|>``) are added as special tokens, so they
    encode as single ids wherever they appear in the text, and are skipped by :meth:`decode`;
    type 4 (user-defined) are added as plain added tokens. Pre-tokenizer: GPT-2's ByteLevel
    regex, preceded for ``pre`` "smollm"/"starcoder"/"refact" by single-digit splitting
    (``Digits(individual_digits=True)``, as those models' tokenizer.json and llama.cpp do), or
    the Llama 3 split regex for "llama-bpe"/"llama3". BOS is prepended only when ``bos`` is
    asked and the file's ``add_bos_token`` says so (SmolLM2: false, so never).

    Raises ValueError when the vocabulary cannot be built (bad merges, ids out of range).
    """

    def __init__(self, tokens: list[str], merges: list[str], token_types: list[int], bos_id: int | None,
                 eos_id: int, add_bos: bool = False, pre: str | None = None, name: str = "gguf"):
        super().__init__()
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
        from tokenizers.models import BPE

        b2u = _bytes_to_unicode()
        alphabet = set(b2u.values())
        # Tokens outside the byte alphabet are re-spelled byte-wise (as transformers' GGUF loader does).
        spelled = [t if set(t) <= alphabet else "".join(b2u[b] for b in t.encode("utf-8")) for t in tokens]
        vocab: dict[str, int] = {}
        for i, t in enumerate(spelled):
            vocab.setdefault(t, i)
        try:
            pairs = [tuple(m.split(" ", 1)) for m in merges]
            self._tok = Tokenizer(BPE(vocab=vocab, merges=pairs, fuse_unk=False))
        except Exception as e:  # tokenizers raises a bare Exception for bad vocab/merges
            raise ValueError(f"{name}: cannot build a BPE tokenizer from the GGUF vocabulary: {e}") from e
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if pre in ("smollm", "starcoder", "refact", "codeshell"):
            self._tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                               byte_level])
        elif pre in ("llama-bpe", "llama3", "llama-v3"):
            self._tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        else:
            self._tok.pre_tokenizer = byte_level
        self._tok.decoder = decoders.ByteLevel()
        types = list(token_types) + [1] * (len(tokens) - len(token_types))
        control = [i for i, ty in enumerate(types) if ty == 3 and set(tokens[i]) <= alphabet]
        user = [i for i, ty in enumerate(types) if ty == 4]
        self._tok.add_special_tokens([AddedToken(tokens[i], normalized=False, special=True) for i in control])
        if user:
            self._tok.add_tokens([AddedToken(tokens[i], normalized=False, special=False) for i in user])
        self.name = name
        self.vocab_size = len(tokens)
        if not 0 <= eos_id < self.vocab_size or (bos_id is not None and not 0 <= bos_id < self.vocab_size):
            raise ValueError(f"{name}: BOS {bos_id} / EOS {eos_id} outside the vocabulary [0, {self.vocab_size})")
        self.eos_id = eos_id
        self.bos_id = bos_id if bos_id is not None else eos_id
        self.add_bos = bool(add_bos) and bos_id is not None
        self.pieces = list(tokens)
        u2b = {v: k for k, v in b2u.items()}
        self._skip = set(control) | {self.eos_id} | ({bos_id} if bos_id is not None else set())
        self._piece_bytes = [bytes(u2b[c] for c in s) if set(s) <= alphabet else s.encode("utf-8") for s in spelled]

    def id_to_piece(self, i: int) -> str:
        if not 0 <= i < self.vocab_size:
            raise ValueError(f"token id {i} out of range [0, {self.vocab_size})")
        return self.pieces[i]

    def token_to_id(self, piece: str) -> int | None:
        """The id of a token spelled as in the vocabulary (``"<|im_end|>"``), or None."""
        i = self._tok.token_to_id(piece)
        return int(i) if i is not None else None

    def encode(self, text: str, bos: bool = True) -> list[int]:
        """Token ids of ``text``; control tokens written in the text become their single id."""
        ids = list(self._tok.encode(text, add_special_tokens=False).ids) if text else []
        return [self.bos_id] + ids if bos and self.add_bos else ids
