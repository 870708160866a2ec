"""Loaders: llama2.c legacy/version-1/untied files, demo model, dispatch and clear errors."""

from __future__ import annotations

import json
import shutil
import struct

import pytest
import torch

from inferctl.engine.loader import build_demo_model, load_hf_dir, load_llama2c, load_model, save_hf_dir
from inferctl.engine.tokenizer import ByteTokenizer
from tests.model_helpers import Harness, RefLlama


@pytest.fixture(scope="module")
def stories(stories_dir):
    return load_llama2c(stories_dir / "stories260K.bin")


def _layers(w, L, name):
    return [w[f"layers.{i}.{name}"] for i in range(L)]


def _write_legacy(path, args, w, untied_cls=None):
    L = args.n_layers
    head = struct.pack("<7i", args.dim, args.hidden_dim, L, args.n_heads, args.n_kv_heads,
                       -args.vocab_size if untied_cls is not None else args.vocab_size, args.max_seq_len)
    parts = [w["tok_embeddings.weight"]]
    for n in ("attention_norm.weight", "attention.wq.weight", "attention.wk.weight", "attention.wv.weight",
              "attention.wo.weight", "ffn_norm.weight", "feed_forward.w1.weight", "feed_forward.w2.weight",
              "feed_forward.w3.weight"):
        parts += _layers(w, L, n)
    parts += [w["norm.weight"], torch.zeros(args.max_seq_len * args.head_dim)]
    if untied_cls is not None:
        parts.append(untied_cls)
    path.write_bytes(head + b"".join(p.numpy().astype("<f4").tobytes() for p in parts))


def test_untied_classifier_file(stories, stories_dir, tmp_path):
    w = stories.model.export_weights()
    g = torch.Generator().manual_seed(3)
    cls = w["tok_embeddings.weight"] + 0.05 * torch.randn(w["tok_embeddings.weight"].shape, generator=g)
    f = tmp_path / "untied.bin"
    _write_legacy(f, stories.args, w, untied_cls=cls)
    shutil.copy(stories_dir / "tok512.bin", tmp_path / "tok512.bin")
    b = load_llama2c(f)
    assert b.args.tie_embeddings is False
    prompt = b.tokenizer.encode("The dog was very")
    ours, rows = Harness(b.model).greedy(0, prompt, 20)
    ref = RefLlama(f)
    assert (torch.stack(rows) - ref.logits(prompt + ours)[len(prompt) - 1:-1]).abs().max().item() < 1e-4
    # int8 covers the separate embedding table and the classifier
    full = b.model.weight_bytes()
    b.model.set_precision("int8")
    assert full / b.model.weight_bytes() >= 3.5
    b.model.set_precision("full")
    # and it converts to a HF directory with lm_head
    out = save_hf_dir(b, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    hb = load_hf_dir(out)
    assert (Harness(hb.model).step([(0, prompt, True)]) - Harness(b.model).step([(0, prompt, True)])).abs().max() < 1e-4


def test_version1_export_format(stories, stories_dir, tmp_path):
    a, w = stories.args, stories.model.export_weights()
    L = a.n_layers
    head = struct.pack("<Ii7iB", 0x616B3432, 1, a.dim, a.hidden_dim, L, a.n_heads, a.n_kv_heads,
                       a.vocab_size, a.max_seq_len, 1)
    head += b"\0" * (256 - len(head))
    parts = (_layers(w, L, "attention_norm.weight") + _layers(w, L, "ffn_norm.weight") + [w["norm.weight"],
             w["tok_embeddings.weight"]])
    for n in ("attention.wq.weight", "attention.wk.weight", "attention.wv.weight", "attention.wo.weight",
              "feed_forward.w1.weight", "feed_forward.w2.weight", "feed_forward.w3.weight"):
        parts += _layers(w, L, n)
    f = tmp_path / "v1.bin"
    f.write_bytes(head + b"".join(p.numpy().astype("<f4").tobytes() for p in parts))
    b = load_llama2c(f, tokenizer_path=stories_dir / "tok512.bin")
    ids = stories.tokenizer.encode("Once upon a time")
    assert torch.equal(Harness(b.model).step([(0, ids, True)]), Harness(stories.model).step([(0, ids, True)]))


def test_llama2c_errors(stories_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.bin"):
        load_llama2c(tmp_path / "nope.bin")
    data = (stories_dir / "stories260K.bin").read_bytes()
    trunc = tmp_path / "trunc.bin"
    trunc.write_bytes(data[:-100])
    with pytest.raises(ValueError, match=r"trunc.bin: file has 1056440 bytes.*implies 1056540"):
        load_llama2c(trunc, tokenizer_path=stories_dir / "tok512.bin")
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="junk.bin: header field dim"):
        load_llama2c(junk)
    lonely = tmp_path / "lonely.bin"
    lonely.write_bytes(data)
    with pytest.raises(FileNotFoundError, match="no llama2.c tokenizer beside"):
        load_llama2c(lonely)
    v2 = tmp_path / "v2.bin"
    v2.write_bytes(struct.pack("<Ii", 0x616B3432, 2) + b"\0" * 300)
    with pytest.raises(ValueError, match="version 2 is not supported"):
        load_llama2c(v2)


def test_hf_dir_errors(stories, tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_hf_dir(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_hf_dir(tmp_path / "empty")
    out = save_hf_dir(stories, tmp_path / "ok")
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "rope_scaling": {"type": "yarn", "factor": 2.0}}))
    with pytest.raises(ValueError, match="rope_scaling type 'yarn' is not supported"):
        load_hf_dir(out)
    (out / "config.json").write_text(json.dumps({**cfg, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}))
    with pytest.raises(ValueError, match="lacks 'low_freq_factor'"):
        load_hf_dir(out)
    (out / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "hidden_size"}))
    with pytest.raises(ValueError, match="missing field 'hidden_size'"):
        load_hf_dir(out)


def test_demo_model_is_seeded_and_runs():
    a, b, c = build_demo_model(0), build_demo_model(0), build_demo_model(1)
    assert isinstance(a.tokenizer, ByteTokenizer) and a.source_path is None and a.name == "demo"
    ids = a.tokenizer.encode("hello")
    la = Harness(a.model).step([(0, ids, True)])
    assert la.shape == (len(ids), 259) and torch.isfinite(la).all()
    assert torch.equal(la, Harness(b.model).step([(0, ids, True)]))
    assert not torch.equal(la, Harness(c.model).step([(0, ids, True)]))
    out, _ = Harness(a.model).greedy(0, ids, 8)
    assert len(out) == 8 and all(0 <= t < 259 for t in out)


def test_load_model_dispatch(stories_dir, tmp_path):
    assert load_model(None).name == "demo"
    assert load_model(str(stories_dir / "stories260K.bin")).name == "stories260K"
    with pytest.raises(FileNotFoundError, match="model not found"):
        load_model(str(tmp_path / "x.bin"))
    other = tmp_path / "model.onnx"
    other.write_bytes(b"ONNX")
    with pytest.raises(ValueError, match="unknown model format"):
        load_model(str(other))
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match="model.gguf: truncated: the file is 4 bytes, shorter than the 24-byte"):
        load_model(str(bad))
