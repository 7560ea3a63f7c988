"""ingest/edge/readiness.py: /readyz answers from the background check's cached state,
and counts the database down only when ingest/edge/db_health.py says so."""

from __future__ import annotations

from ingest.edge.db_health import DatabaseHealth
from ingest.edge.readiness import Readiness


def readiness(listening: bool = True) -> Readiness:
    return Readiness(
        None,  # type: ignore[arg-type]  # report() never touches the database
        refresh_s=1.0,
        listening=lambda: listening,
        revocations=lambda: False,
        health=DatabaseHealth(stale_s=5.0),
    )


def test_ready_only_with_a_recent_probe_an_up_database_and_a_listener() -> None:
    r = readiness()
    assert r.report(now=100.0)[0] is False  # never checked
    r.health.answered(99.0, 0.002)
    r.checked_at = 99.0
    ok, checks = r.report(now=100.0)
    assert ok and checks["age_ms"] == 1000
    assert checks["database_state"] == "ok" and checks["database_ms"] == 2.0
    assert checks["revocation_listener"] is False  # reported, not required
    assert r.report(now=103.9)[0] is True
    # Three periods past the probe's own 2 s timeout: the probing task is stuck.
    assert r.report(now=104.1)[0] is False


def test_a_slow_database_keeps_the_instance_ready() -> None:
    r = readiness()
    r.health.answered(99.0, 0.002)
    r.health.timed_out(101.0)
    r.checked_at = 101.0
    ok, checks = r.report(now=101.0)
    assert ok and checks["database"] is True and checks["database_state"] == "slow"
    r.health.failed(102.0)
    r.checked_at = 102.0
    ok, checks = r.report(now=102.0)
    assert not ok and checks["database_state"] == "down"


def test_not_ready_without_the_result_listener() -> None:
    r = readiness(listening=False)
    r.health.answered(100.0)
    r.checked_at = 100.0
    ok, checks = r.report(now=100.0)
    assert not ok and checks["listener"] is False
