"""``inferctl engine serve --speculative-config JSON``: the settings reach the engine, a bad value
stops the command before the model loads, and /metrics counts the drafts (CliRunner, no port)."""

from __future__ import annotations

import json


from tests.server_helpers import engines_running, run, serve_without_listening


def serve(monkeypatch, args: list[str]):
    return serve_without_listening(monkeypatch, args)


def test_flag_reaches_the_engine_and_metrics_count_drafts(monkeypatch, stories_dir):
    import httpx

    cfg = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    res, seen = serve(monkeypatch, ["--model", str(stories_dir / "stories260K.bin"),
                                    "--speculative-config", json.dumps(cfg)])
    assert res.exit_code == 0, res.output
    [eng] = seen["engines"].values()
    sc = eng.engine.config.speculative_config
    assert (sc.method, sc.num_speculative_tokens, sc.prompt_lookup_max) == ("ngram", 3, 3)

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=seen["app"]),
                                     base_url="http://127.0.0.1") as c:
            prompt = "Lily and Ben went to the park. Lily and Ben went to the park. Lily and Ben"
            r = await c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 40, "temperature": 0})
            assert r.status_code == 200, r.text
            return (await c.get("/metrics")).text, (await c.get("/stats")).json()
    eng.start()
    with engines_running(eng):
        text, stats = run(go())
    drafts = [ln for ln in text.splitlines() if ln.startswith("inferctl_engine_spec_decode_num_drafts_total ")]
    assert drafts and float(drafts[0].split()[1]) > 0
    assert stats["spec_decode"]["num_drafts"] == float(drafts[0].split()[1])


def test_bad_value_stops_before_loading(monkeypatch):
    res, seen = serve(monkeypatch, ["--model", "/nonexistent.bin",
                                    "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 40}'])
    assert res.exit_code == 2
    assert "--speculative-config: speculative_config.num_speculative_tokens: must be 1..16, got 40" in res.output
    assert "engines" not in seen
