"""The HF loader's config.json values (engine/loader.py load_hf_dir): every bad value is a ValueError naming
the file and the key, checked before anything is built from it (a breaker's cases, session 16: a huge layer
count never finished loading, huge floats raised OverflowError, 0/false stood for "absent", "no" read as true,
``true`` and -5 were token ids)."""

from __future__ import annotations

import json

import pytest

from inferctl.engine.loader import load_hf_dir, load_llama2c, save_hf_dir


@pytest.fixture(scope="module")
def hf_dir(stories_dir, tmp_path_factory):
    return save_hf_dir(load_llama2c(stories_dir / "stories260K.bin"), tmp_path_factory.mktemp("hf") / "stories")


def _with(hf_dir, tmp_path, change):
    """A copy of ``hf_dir`` whose config.json has ``change`` applied (a dict merged in, or a function)."""
    d = tmp_path / "m"
    d.mkdir()
    for f in hf_dir.iterdir():
        (d / f.name).symlink_to(f)
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg = change(cfg) or cfg if callable(change) else {**cfg, **change}
    (d / "config.json").unlink()
    (d / "config.json").write_text(json.dumps(cfg, allow_nan=True))
    return d


@pytest.mark.timeout(30)
@pytest.mark.parametrize("key, value, words", [
    ("num_hidden_layers", 1e30, "'num_hidden_layers' must be an integer from 1 to 2,147,483,647"),
    ("num_hidden_layers", 3, "'num_hidden_layers' is 3 but the weights hold 5 layer(s)"),
    ("max_position_embeddings", 1e308, "'max_position_embeddings' must be an integer from 1"),
    ("max_position_embeddings", 2 ** 63, "'max_position_embeddings' must be an integer from 1"),
    ("hidden_size", 10 ** 300, "'hidden_size' must be an integer from 1"),
    ("rope_theta", 10 ** 400, "'rope_theta' must be a finite number above 0"),
    ("rope_theta", 0, "'rope_theta' must be a finite number above 0"),
    ("rope_theta", -1.0, "'rope_theta' must be a finite number above 0"),
    ("rms_norm_eps", -1.0, "'rms_norm_eps' must be a finite number above 0"),
    ("rms_norm_eps", float("nan"), "'rms_norm_eps' must be a finite number above 0"),
    ("num_key_value_heads", 0, "'num_key_value_heads' must be an integer from 1"),
    ("num_key_value_heads", False, "'num_key_value_heads' must be an integer from 1"),
    ("head_dim", 0, "'head_dim' must be an integer from 1"),
    ("tie_word_embeddings", "no", "'tie_word_embeddings' must be true or false"),
    ("bos_token_id", True, "'bos_token_id' must be a token id from 0 to 511"),
    ("bos_token_id", -5, "'bos_token_id' must be a token id from 0 to 511"),
    ("eos_token_id", 1e30, "'eos_token_id' must be a token id from 0 to 511"),
])
def test_a_bad_value_names_its_key(hf_dir, tmp_path, key, value, words):
    d = _with(hf_dir, tmp_path, {key: value})
    with pytest.raises(ValueError) as err:
        load_hf_dir(d)
    assert str(err.value).startswith(f"{d / 'config.json'}: ") and words in str(err.value)


@pytest.mark.parametrize("scaling, words", [
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": float("inf")}, "'original_max_position_embeddings' must be an integer"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": "8192"}, "'original_max_position_embeddings' must be an integer"),
    ({"rope_type": "linear", "factor": True}, "'factor' must be a finite number above 0"),
    ({"rope_type": "linear", "factor": 10 ** 400}, "'factor' must be a finite number above 0"),
])
def test_bad_rope_scaling_names_its_field(hf_dir, tmp_path, scaling, words):
    d = _with(hf_dir, tmp_path, {"rope_scaling": scaling})
    with pytest.raises(ValueError, match="rope_scaling field") as err:
        load_hf_dir(d)
    assert words in str(err.value)


def test_absent_or_null_keys_take_their_defaults(hf_dir, tmp_path):
    """null is "absent" (transformers writes it): the defaults apply and the model loads as before."""
    d = _with(hf_dir, tmp_path, {"head_dim": None, "rope_theta": None,
                                 "rms_norm_eps": None, "bos_token_id": None})
    b = load_hf_dir(d)
    ref = load_hf_dir(hf_dir)
    assert b.model.args.rope_theta == 10000.0 and b.model.args.head_dim == ref.model.args.head_dim
    assert b.model.args.norm_eps == 1e-6
    assert b.model.args.dim == ref.model.args.dim and b.model.args.tie_embeddings is ref.model.args.tie_embeddings
