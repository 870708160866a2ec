"""A truncated or garbage ``.gguf`` gives one clear ValueError naming the file and what is wrong
(empty, not GGUF, unknown version, shorter than the header, truncated past it), never a numpy
error on its own; ``inferctl engine serve --model bad.gguf`` prints it without a traceback."""

from __future__ import annotations

import numpy as np
import pytest

from inferctl.engine.gguf import open_gguf
from inferctl.engine.loader import load_model


def tiny_gguf(path) -> bytes:
    """A small valid GGUF file (metadata + one 64×64 f32 tensor) written with gguf's own writer."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.arange(64 * 64, dtype=np.float32).reshape(64, 64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


@pytest.fixture
def good(tmp_path):
    return tiny_gguf(tmp_path / "good.gguf")


def cut(tmp_path, data: bytes, name: str = "bad.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_the_tiny_file_reads(tmp_path, good):
    assert len(open_gguf(cut(tmp_path, good, "ok.gguf")).tensors) == 1


@pytest.mark.parametrize("make, words", [
    (lambda good: b"", r"the file is empty \(0 bytes\)"),
    (lambda good: b"\x00" * 4096, r"not a GGUF file: it starts with b'\\x00\\x00\\x00\\x00', not the GGUF magic"),
    (lambda good: good[:10], r"truncated: the file is 10 bytes, shorter than the 24-byte GGUF header"),
    (lambda good: b"GGUF" + (7).to_bytes(4, "little") + good[8:], r"GGUF version 7 is not supported \(versions 2, 3\)"),
    (lambda good: good[:60], r"truncated or corrupt GGUF file \(60 bytes\)"),                  # in the metadata
    (lambda good: good[:len(good) - 100], r"truncated or corrupt GGUF file \(\d+ bytes\).*points past the end"),
])
def test_bad_files_name_the_file_and_what_is_wrong(tmp_path, good, make, words):
    p = cut(tmp_path, make(good))
    with pytest.raises(ValueError, match=words) as err:
        load_model(str(p))                     # the engine's loader, by the .gguf suffix
    assert str(err.value).startswith(f"{p}: ")
    assert "When changing to a larger dtype" not in str(err.value).split("(gguf reader:")[0]


def test_engine_serve_prints_the_reason_without_a_traceback(tmp_path, good):
    from typer.testing import CliRunner

    from inferctl.cli import app

    p = cut(tmp_path, good[:len(good) - 100])
    r = CliRunner().invoke(app, ["engine", "serve", "--model", str(p), "--port", "0", "--device", "cpu"])
    assert r.exit_code != 0
    out = r.output + (r.stderr if r.stderr_bytes is not None else "")
    assert "truncated or corrupt GGUF file" in out and str(p) in out.replace("\n", "")
    assert "Traceback" not in out and not isinstance(r.exception, (ValueError, IndexError))
