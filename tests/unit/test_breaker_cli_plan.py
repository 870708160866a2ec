"""Breaker regressions for ``inferctl plan``: inputs that crashed it or that it wrongly accepted.

* A malformed Hugging Face ``config.json`` (not JSON, not an object, a key missing, null, a
  string or zero where a count goes) gave a traceback: now exit 2 naming the file and the key.
* A truncated (or padded) llama2.c ``.bin`` was planned as if whole (exit 0): the file size is
  checked against what the header implies, as the engine's loader does (exit 2, expected vs
  actual bytes).
* ``--context`` and ``--concurrency`` had no upper bound: at most 1,048,576 tokens and 100,000
  sequences (exit 2 naming the flag and the limit).
* A GGUF file planned as stored printed "plan: x.gguf at stored, ...": the title now says
  "at the file's own precision (F32 ×1, F16 ×1)" and the weights row "as stored in the file (...)".
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from inferctl.cli import app
from inferctl.tools.plan import MAX_CONCURRENCY, MAX_CONTEXT, PlanError, compute_plan, dims_from_flags

HF = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128,
      "vocab_size": 32, "max_position_embeddings": 256}


def _plan(*args: str):  # noqa: ANN202 - click's Result
    return CliRunner().invoke(app, ["plan", *args])


def _refused(r, *words: str) -> str:
    out = r.output
    assert r.exit_code == 2, (r.exit_code, out, r.exception)
    assert "Traceback" not in out and out.startswith("error: "), out
    for w in words:
        assert w in out, (w, out)
    return out


# ---------------------------------------------------------------- config.json
def _hf_dir(tmp_path, config) -> str:
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return str(d)


@pytest.mark.parametrize("config, words", [
    ("{not json", "not valid JSON"),
    ("[1, 2, 3]", "must be a JSON object of the model's settings, got list"),
    ({k: v for k, v in HF.items() if k != "vocab_size"}, "missing key 'vocab_size'"),
    ({**HF, "num_attention_heads": None}, "missing key 'num_attention_heads'"),
    ({**HF, "num_attention_heads": 0}, "key 'num_attention_heads' must be an integer >= 1, got 0"),
    ({**HF, "hidden_size": "64"}, "key 'hidden_size' must be an integer >= 1, got '64'"),
    ({**HF, "num_hidden_layers": 2.5}, "key 'num_hidden_layers' must be an integer >= 1, got 2.5"),
    ({**HF, "max_position_embeddings": "long"}, "key 'max_position_embeddings' must be an integer >= 1"),
    ({**HF, "num_attention_heads": 3}, "key 'hidden_size' (64) must be a multiple of 'num_attention_heads' (3)"),
    ({**HF, "num_key_value_heads": 3}, "key 'num_key_value_heads' (3) must divide 'num_attention_heads' (4)"),
    ({**HF, "hidden_size": 8 * 10 ** 300}, "key 'hidden_size' must be at most 2,147,483,647, got 8000"),
    ({**HF, "vocab_size": 10 ** 400}, "key 'vocab_size' must be at most 2,147,483,647"),
    ({**HF, "num_hidden_layers": 10 ** 14}, "key 'num_hidden_layers' must be at most 2,147,483,647"),
    ({**HF, "tie_word_embeddings": "yes"}, "key 'tie_word_embeddings' must be true or false, got 'yes'"),
])
def test_malformed_config_json_names_the_file_and_the_key(tmp_path, config, words):
    d = _hf_dir(tmp_path, config)
    _refused(_plan("--model", d), f"--model: {d}/config.json: ", words)


def test_a_whole_config_json_still_plans(tmp_path):
    r = _plan("--model", _hf_dir(tmp_path, HF), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["context"] == 256


def test_a_malformed_safetensors_header_names_the_file(tmp_path):
    d = _hf_dir(tmp_path, HF)
    (tmp_path / "hf" / "model.safetensors").write_bytes((10 ** 9).to_bytes(8, "little") + b"{}")
    _refused(_plan("--model", d), "model.safetensors: not a readable safetensors header")


# ---------------------------------------------------------------- a truncated llama2.c .bin
def test_a_truncated_llama2c_bin_is_refused_with_expected_and_actual_bytes(tmp_path, stories_dir):
    data = (stories_dir / "stories260K.bin").read_bytes()
    cut = tmp_path / "cut.bin"
    cut.write_bytes(data[:-4])
    out = _refused(_plan("--model", str(cut)), f"--model: {cut}: truncated", f"implies {len(data):,} bytes",
                   f"the file has {len(data) - 4:,}")
    padded = tmp_path / "padded.bin"
    padded.write_bytes(data + b"\0" * 8)
    _refused(_plan("--model", str(padded)), "too long", f"the file has {len(data) + 8:,}")
    assert "Traceback" not in out


def test_the_whole_llama2c_bin_still_plans(stories_dir):
    assert _plan("--model", str(stories_dir / "stories260K.bin"), "--json").exit_code == 0


# ---------------------------------------------------------------- --context / --concurrency
@pytest.mark.parametrize("args, words", [
    (["--context", str(MAX_CONTEXT + 1)], "--context: must be at most 1,048,576 tokens, got 1,048,577"),
    (["--context", "10000000000"], "--context: must be at most 1,048,576 tokens"),
    (["--context", "4096", "--concurrency", str(MAX_CONCURRENCY + 1)],
     "--concurrency: must be at most 100,000 sequences, got 100,001"),
    (["--context", "4096", "--concurrency", "10000000000000"], "--concurrency: must be at most 100,000 sequences"),
])
def test_context_and_concurrency_have_upper_bounds(args, words):
    _refused(_plan("--params", "7B", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", *args), words)


def test_the_bounds_themselves_are_accepted():
    d = dims_from_flags("7B", layers=32, kv_heads=8, head_dim=128)
    assert compute_plan(d, "fp16", MAX_CONTEXT, MAX_CONCURRENCY).context == 1 << 20
    with pytest.raises(PlanError, match="--concurrency"):
        compute_plan(d, "fp16", 4096, MAX_CONCURRENCY + 1)


# ---------------------------------------------------------------- "at stored"
def _tiny_gguf(path) -> str:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_feed_forward_length(128)
    w.add_context_length(256)
    w.add_vocab_size(32)
    w.add_tensor("token_embd.weight", np.zeros((32, 64), dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((64, 64), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_gguf_title_and_weights_row_say_what_stored_means(tmp_path):
    r = _plan(_tiny_gguf(tmp_path / "tiny.gguf"))
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == ("plan: tiny.gguf at the file's own precision (F32 ×1, F16 ×1), context 256, "
                        "concurrency 1, KV fp16")
    assert "at stored" not in r.output
    weights = next(line for line in lines if line.startswith("weights "))
    assert weights.endswith("16,384 bytes = as stored in the file (F32 ×1, F16 ×1)")
    assert json.loads(_plan(str(tmp_path / "tiny.gguf"), "--json").output)["precision"] == "stored"   # unchanged


@pytest.mark.parametrize("extra, words", [
    ({"torch_dtype": "int3"}, "torch_dtype='int3', a precision plan does not know"),
    ({"dtype": "float64"}, "dtype='float64', a precision plan does not know"),
])
def test_an_unknown_file_precision_needs_precision_and_plans_with_it(tmp_path, extra, words):
    d = _hf_dir(tmp_path, {**HF, **extra})
    _refused(_plan("--model", d), "--precision: the model's config.json gives ", words)
    r = _plan("--model", d, "--precision", "bf16", "--json")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("extra, bytes_per_param", [({"dtype": "float32"}, 4), ({"torch_dtype": "torch.float16"}, 2),
                                                    ({"torch_dtype": "auto"}, 2), ({"tie_word_embeddings": None}, 2)])
def test_the_file_precision_is_read_from_dtype_too(tmp_path, extra, bytes_per_param):
    """transformers >= 4.56 writes ``dtype``; ``torch.float16`` and ``auto`` occur in the wild."""
    r = _plan("--model", _hf_dir(tmp_path, {**HF, **extra}), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["weights_bytes"] == doc["model"]["params"] * bytes_per_param, doc
