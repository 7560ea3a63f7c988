"""ingest/edge/db_health.py: a slow database is not a down one."""

from __future__ import annotations

import time

import pytest

from core.config import Settings
from core.errors import Unavailable
from ingest.admission.load_watch import LoadWatch
from ingest.admission.policy import check_admission
from ingest.admission.ratelimit import TenantLimiter
from ingest.edge.db_health import DatabaseHealth, report_window_s, too_slow_to_store
from results.tenants import Tenant


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


def test_commit_time_is_the_slowest_recent_write_or_the_one_under_way() -> None:
    h = DatabaseHealth(stale_s=5.0)
    assert h.commit_s(0.0) == 0.0
    h.writing(1.0)
    h.committed(1.004, 0.004)
    h.writing(1.25)
    h.committed(1.55, 0.3)  # a checkpoint's slow commit
    assert h.commit_s(2.0) == pytest.approx(0.3)
    h.writing(2.0)  # a stall: nothing comes back, and the measure grows with it
    assert h.commit_s(4.5) == pytest.approx(2.5)
    h.committed(9.0, 7.0)
    assert h.commit_s(9.0) == pytest.approx(7.0)
    assert h.commit_s(14.5) == 0.0  # older than the window: forgotten


def test_a_failed_write_is_not_a_stall() -> None:
    h = DatabaseHealth(stale_s=5.0)
    h.writing(1.0)
    h.write_failed()
    assert h.stall_s(9.0) == 0.0


def test_reports_may_look_older_by_two_commits() -> None:
    assert report_window_s(5.0, 0.0) == 5.0
    assert report_window_s(5.0, 3.0) == 11.0


def test_only_a_commit_that_alone_outlasts_the_deadline_refuses() -> None:
    assert too_slow_to_store(1.0, 0.0, 0.12) is None
    assert too_slow_to_store(1.0, 0.5, 0.12) is None  # slower, still in time: admitted
    why = too_slow_to_store(1.0, 0.95, 0.12)
    assert why is not None and "950 ms" in why and "1000 ms" in why
    assert too_slow_to_store(5.0, 0.95, 0.12) is None  # a longer deadline still fits


def test_admission_takes_the_commit_time_off_the_deadline() -> None:
    settings = Settings()
    watch = LoadWatch(None, settings, TenantLimiter())  # type: ignore[arg-type]
    watch.health = DatabaseHealth(stale_s=settings.load_report_stale_s)
    tenant = Tenant("t1", "t1", "enterprise", 1.0, None, None, None)
    check_admission(watch, settings, tenant, "sim@1")  # nothing measured: admitted
    now = time.monotonic()
    watch.health.committed(now, 3.0)
    check_admission(watch, settings, tenant, "sim@1")  # a past slow commit: admitted
    watch.health.writing(now - 0.4)
    check_admission(watch, settings, tenant, "sim@1")  # 400 ms of 1,000: admitted
    watch.health.writing(now - 2.0)  # a write under way for 2 s: a stall
    with pytest.raises(Unavailable) as err:
        check_admission(watch, settings, tenant, "sim@1")
    assert err.value.reason == "slow_database" and err.value.retry_after_s == pytest.approx(2, 0.1)
    check_admission(watch, settings, tenant, "sim@1", timeout_ms=10_000)  # time enough
    watch.health.committed(time.monotonic(), 2.1)  # the stall ends: admitted at once
    check_admission(watch, settings, tenant, "sim@1")
