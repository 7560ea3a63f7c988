"""The benchmark command still works: a few seconds at a low rate against Gristmill only.

Asserts that numbers and charts came out, never how fast anything was.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gristmill.devservices.stack import Services

# The sweep's histograms; part of the dev extra (a fresh install without it skips, loudly).
pytest.importorskip("hdrh", reason="hdrhistogram is not installed (dev extra)")
from bench.sweep import main


def test_sweep_smoke(services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Reuse the session's Kafka and PostgreSQL; the sweep's system gets its own topics.
    monkeypatch.setenv("KAFKA_BOOTSTRAP", services.bootstrap)
    monkeypatch.setenv("DATABASE_URL", services.database_url)
    argv = ["--systems", "gristmill", "--rates", "5,10", "--duration", "2", "--clients", "1"]
    assert main([*argv, "--out", str(tmp_path)]) == 0

    out = json.loads((tmp_path / "sweep.json").read_text())
    runs = out["runs"]
    assert [r["offered_rps"] for r in runs] == [5, 10]
    for r in runs:
        assert r["requests"] == int(r["offered_rps"] * 2)
        assert r["statuses"].get("200", 0) > 0
        assert r["wrong_outputs"] == 0
        assert r["p50_ms"] is not None and r["p99_ms"] is not None
        assert r["mean_batch_size"] is not None and r["busy_fraction"] > 0
        assert "compute_ms" in r["stages_ms"]
    for chart in ("latency.png", "throughput.png", "breakdown.png"):
        assert (tmp_path / chart).stat().st_size > 1000
    assert "| gristmill |" in (tmp_path / "table.md").read_text()


def test_policy_benchmarks_smoke(
    services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench.overload and bench.fairness run end to end and write their reports."""
    from bench import fairness, overload

    monkeypatch.setenv("KAFKA_BOOTSTRAP", services.bootstrap)
    monkeypatch.setenv("DATABASE_URL", services.database_url)
    argv = ["--shapes", "100:10", "--factor", "0.5", "--seconds", "2", "--out", str(tmp_path)]
    assert overload.main(argv) == 0
    report = json.loads(next(tmp_path.glob("overload-100ms-*.json")).read_text())
    assert {r["tier"] for r in report["tiers"]} == {"free", "paid", "enterprise"}
    assert all(r["lost"] == 0 for r in report["tiers"])
    assert set(report["simulated"]["tiers"]) == {"free", "paid", "enterprise"}
    assert next(tmp_path.glob("overload-100ms-*.png")).stat().st_size > 1000

    argv = ["--burst", "100", "--noisy-rate", "50", "--quiet-rate", "5", "--quiet-seconds", "1"]
    assert fairness.main([*argv, "--out", str(tmp_path)]) == 0
    report = json.loads(next(tmp_path.glob("fairness-*.json")).read_text())
    assert report["quiet_alone"]["served_200"] == 5
    assert report["noisy"]["offered"] == 100
    assert report["lost"] == {"quiet": 0, "noisy": 0}
    assert "batch_wait" in report["stages"]["quiet_alone"]
    assert next(tmp_path.glob("fairness-*.png")).stat().st_size > 1000


def test_the_gpu_host_bench_sees_what_postgresql_waits_on(database: str) -> None:
    """bench/gpuhost/measure.py ``PgWaits``: an active backend sleeping in the server is
    counted under its wait event; the sampler's own backend is not counted."""
    import threading

    import psycopg

    from bench.gpuhost.measure import PgWaits
    from results.db import libpq_url

    dsn = libpq_url(database)

    def sleep() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_sleep(1)")

    with PgWaits(dsn) as waits:
        sleeper = threading.Thread(target=sleep)
        sleeper.start()
        sleeper.join()
    got = waits.summary()
    assert waits.samples > 5
    assert "Timeout:PgSleep" in got["by_state"]
    assert 0 < got["by_state"]["Timeout:PgSleep"] <= 1.0
