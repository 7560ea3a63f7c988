"""ingest/db_health.py: a slow database is not a down one."""

from __future__ import annotations

from ingest.db_health import DatabaseHealth


def test_down_until_the_database_first_answers() -> None:
    h = DatabaseHealth(stale_s=5.0)
    assert h.state(0.0) == "down"
    h.answered(1.0, 0.004)
    assert h.state(1.0) == "ok"
    assert h.latency_ms == 4.0


def test_a_timed_out_probe_while_commits_land_is_slow_not_down() -> None:
    h = DatabaseHealth(stale_s=5.0)
    h.answered(10.0, 0.003)
    h.timed_out(12.0)  # a checkpoint: the probe waited 2 s
    assert h.state(12.0) == "slow"
    h.heard(13.0)  # a result announcement: someone's commit went through
    assert h.state(16.0) == "slow"  # 6 s since the last answer, 3 s since a commit
    h.answered(16.5, 2.5)  # the heartbeat's commit, slow
    assert h.state(16.5) == "ok"


def test_no_sign_of_life_for_the_stale_window_is_down() -> None:
    h = DatabaseHealth(stale_s=5.0)
    h.answered(10.0)
    h.timed_out(12.0)
    h.timed_out(15.0)
    assert h.state(15.0) == "slow"
    assert h.state(15.1) == "down"  # a frozen database: nothing answered or heard for 5 s
    h.heard(16.0)
    assert h.state(16.0) == "slow"  # commits land again


def test_an_outright_failure_is_down_until_something_answers() -> None:
    h = DatabaseHealth(stale_s=5.0)
    h.answered(10.0)
    h.failed(11.0)  # connection refused: a restart
    h.heard(11.5)  # announcements alone do not clear it: this instance's queries fail
    assert h.state(11.5) == "down"
    h.answered(12.0, 0.01)
    assert h.state(12.0) == "ok"


def test_latency_is_smoothed_over_answers() -> None:
    h = DatabaseHealth(stale_s=5.0)
    h.answered(1.0, 0.010)
    h.answered(2.0, 0.110)
    assert h.latency_ms is not None and 10 < h.latency_ms < 110
    h.answered(3.0)  # an answer without a time leaves the reading as it was
    assert h.latency_ms is not None and 10 < h.latency_ms < 110
