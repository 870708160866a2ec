"""Smoke test of ``bench.prefix_cache`` at a tiny size: it runs both settings, the outputs are
identical (exit 0) and the caching row shows hits."""

from __future__ import annotations

from bench import prefix_cache


def test_prefix_cache_bench_smoke(capsys):
    rc = prefix_cache.main(["--n", "4", "--system-tokens", "64", "--user-tokens", "6", "--max-tokens", "3",
                            "--repeats", "1", "--quick"])
    out = capsys.readouterr().out
    assert rc == 0 and "outputs identical" in out
    on_row = next(line for line in out.splitlines() if line.startswith("| on |"))
    assert float(on_row.split("|")[-2]) > 0        # hit ratio %
