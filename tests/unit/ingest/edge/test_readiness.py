"""ingest/edge/readiness.py: /readyz answers from the background check's cached state."""

from __future__ import annotations

from ingest.edge.readiness import Readiness


def readiness(listening: bool = True) -> Readiness:
    return Readiness(
        None,  # type: ignore[arg-type]  # report() never touches the database
        refresh_s=1.0,
        listening=lambda: listening,
        revocations=lambda: False,
    )


def test_ready_only_with_a_fresh_passing_check_and_a_listener() -> None:
    r = readiness()
    assert r.report(now=100.0)[0] is False  # never checked
    r.database, r.checked_at = True, 99.0
    ok, checks = r.report(now=100.0)
    assert ok and checks["age_ms"] == 1000
    assert checks["revocation_listener"] is False  # reported, not required
    assert r.report(now=101.9)[0] is True
    assert r.report(now=102.1)[0] is False  # three periods old: the checking task is stuck
    r.database = False
    assert r.report(now=100.0)[0] is False


def test_not_ready_without_the_result_listener() -> None:
    r = readiness(listening=False)
    r.database, r.checked_at = True, 100.0
    ok, checks = r.report(now=100.0)
    assert not ok and checks["listener"] is False
