"""``inferctl plan --speculative-config``: a draft model's weights and KV pool are in the plan
(tools/plan_draft.py), as the engine's memory plan holds them (tags draft_weights, draft_kv_cache)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from inferctl.cli import app
from inferctl.tools.plan import PlanError, compute_plan, dims_from_flags, read_model

INT8_SELF = {"method": "int8_self", "num_speculative_tokens": 3}


def test_int8_self_adds_an_int8_copy_and_a_kv_twin(stories_dir):
    d = read_model(str(stories_dir / "stories260K.bin"))
    base = compute_plan(d, "fp32", 512, 64)
    spec = compute_plan(d, "fp32", 512, 64, speculative_config=json.dumps(INT8_SELF))
    dr = spec.draft
    # dim 64, hidden 172, 5 layers, 8/4 heads of 8, vocab 512 tied: int8 rows (inner dim padded to 16)
    # + 6 bytes a row, norms fp32 (LlamaModel.weight_bytes_by_mode()["int8"])
    rows = [(512, 64), (128, 64), (64, 64), (344, 64), (64, 176)]
    expect = 11 * 64 * 4 + sum(o * i + 6 * o for o, i in rows[:1]) + 5 * sum(o * i + 6 * o for o, i in rows[1:])
    assert dr["weights_bytes"] == expect
    assert dr["kv_bytes_per_token"] == base.kv_bytes_per_token == 1280
    assert dr["kv_bytes"] == base.kv_bytes == 1280 * 512 * 64
    assert spec.total_bytes == base.total_bytes + expect + base.kv_bytes
    assert base.draft is None


def test_draft_model_is_sized_by_its_own_dimensions_at_the_plans_precision(stories_dir):
    path = str(stories_dir / "stories260K.bin")
    d = read_model(path)
    cfg = {"method": "draft_model", "num_speculative_tokens": 4, "model": path}
    p = compute_plan(d, "bf16", 1024, 2, speculative_config=cfg)
    assert p.draft["weights_bytes"] == d.params * 2
    assert p.draft["kv_bytes_per_token"] == 2 * 5 * 4 * 8 * 2      # KV auto = 16 bits beside bf16
    assert p.total_bytes == compute_plan(d, "bf16", 1024, 2).total_bytes + d.params * 2 + 640 * 1024 * 2


def test_ngram_adds_nothing_and_says_so(stories_dir):
    d = read_model(str(stories_dir / "stories260K.bin"))
    p = compute_plan(d, "fp32", 256, 1, speculative_config='{"method": "ngram", "num_speculative_tokens": 4}')
    assert p.draft is None and p.total_bytes == compute_plan(d, "fp32", 256, 1).total_bytes
    assert any("ngram" in n for n in p.notes)


def test_bad_speculative_configs_name_the_flag_and_key(stories_dir, tmp_path):
    d = read_model(str(stories_dir / "stories260K.bin"))
    with pytest.raises(PlanError) as e:
        compute_plan(d, "fp32", 256, 1, speculative_config='{"method": "int8_self", "num_speculative_tokens": 99}')
    assert e.value.flag == "--speculative-config" and "num_speculative_tokens" in str(e.value) and "16" in str(e.value)
    with pytest.raises(PlanError, match="speculative_config.model: .*no such file"):
        compute_plan(d, "fp32", 256, 1, speculative_config={"method": "draft_model", "num_speculative_tokens": 2,
                                                             "model": str(tmp_path / "missing.bin")})
    other = tmp_path / "other-vocab"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 8, "num_hidden_layers": 2,
                                                   "intermediate_size": 128, "vocab_size": 1000}))
    with pytest.raises(PlanError, match="vocabulary \\(1000 tokens\\) differs from the target's \\(512\\)"):
        compute_plan(d, "fp32", 256, 1, speculative_config={"method": "draft_model", "num_speculative_tokens": 2,
                                                             "model": str(other)})


def test_int8_self_without_dimensions_is_no_data_not_zero():
    p = compute_plan(dims_from_flags(params="7B"), "fp16", 4096, 1, speculative_config=INT8_SELF)
    assert p.draft["weights_bytes"] is None and p.draft["kv_bytes"] is None
    assert any("no data" in n for n in p.notes)


def test_cli_shows_the_draft_rows_and_exits_2_on_a_bad_config(stories_dir):
    path = str(stories_dir / "stories260K.bin")
    r = CliRunner().invoke(app, ["plan", path, "--context", "512", "--speculative-config", json.dumps(INT8_SELF)])
    assert r.exit_code == 0, r.output
    assert "draft weights" in r.output and "draft KV cache" in r.output and "int8 copy of stories260K.bin" in r.output
    r = CliRunner().invoke(app, ["plan", path, "--speculative-config", "{not json"])
    assert r.exit_code == 2 and "--speculative-config" in r.output
