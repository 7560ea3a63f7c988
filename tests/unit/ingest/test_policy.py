"""Rate limits, admission by predicted delay, capacity from measured costs."""

from __future__ import annotations

import math

import pytest

from core.load_report import LoadReport
from ingest.admission import LoadView, decide, predicted_delay_s
from ingest.ratelimit import TenantLimiter, TokenBucket
from scheduler.capacity import best_throughput, capacity_by_model
from scheduler.costmodel import CostModel

THRESH = {"enterprise": 2000.0, "paid": 600.0, "free": 250.0}


def test_bucket_allows_burst_then_refuses_with_retry_after() -> None:
    b = TokenBucket(rate=10, burst=3, now=0.0)
    assert [b.take(1, 0.0).allowed for _ in range(4)] == [True, True, True, False]
    v = b.take(1, 0.0)
    assert not v.allowed and v.retry_after_s == pytest.approx(0.1)
    assert b.take(1, 0.1).allowed  # refilled one token


def test_bucket_headers_numbers() -> None:
    b = TokenBucket(rate=5, burst=10, now=0.0)
    v = b.take(4, 0.0)
    assert v.remaining == 6 and v.reset_s == pytest.approx(0.8) and v.limit == 5


def test_debt_lets_a_big_job_in_once_then_waits_it_off() -> None:
    b = TokenBucket(rate=100, burst=1000, now=0.0)
    assert b.take(0, 0.0, allow_debt=True).allowed
    assert b.take(5000, 0.0, allow_debt=True).allowed  # had tokens: admitted, now in debt
    v = b.take(0, 1.0, allow_debt=True)
    assert not v.allowed and v.retry_after_s == pytest.approx(39.0, abs=0.1)
    assert b.take(0, 40.0, allow_debt=True).allowed


def test_limiter_splits_limits_across_instances() -> None:
    lim = TenantLimiter()
    lim.instances = 4
    allowed = sum(
        lim.check("t", "requests", rate=100, burst=40, n=1, now=0.0).allowed for _ in range(20)
    )
    assert allowed == 10  # burst 40 / 4 instances


def test_limiter_keeps_tenants_apart() -> None:
    lim = TenantLimiter()
    for _ in range(5):
        lim.check("a", "requests", rate=1, burst=5, n=1, now=0.0)
    assert not lim.check("a", "requests", rate=1, burst=5, n=1, now=0.0).allowed
    assert lim.check("b", "requests", rate=1, burst=5, n=1, now=0.0).allowed


def view(cap: float, backlog: dict[str, int], lag: dict[str, int] | None = None) -> LoadView:
    return LoadView.combine([LoadReport({"sim@1": cap}, {"sim@1": backlog}, lag or {})])


def test_delay_counts_work_at_or_above_the_class() -> None:
    v = view(1000, {"enterprise": 100, "paid": 200, "free": 700, "jobs": 5000})
    assert predicted_delay_s(v, "sim@1", "enterprise", 1.0) == pytest.approx(0.1)
    assert predicted_delay_s(v, "sim@1", "paid", 1.0) == pytest.approx(0.3)
    assert predicted_delay_s(v, "sim@1", "free", 1.0) == pytest.approx(1.0)
    assert predicted_delay_s(v, "sim@1", "free", 0.5) == pytest.approx(2.0)


def test_free_is_shed_first_then_paid_then_enterprise() -> None:
    def shed(backlog: int) -> list[str]:
        v = view(1000, {"free": backlog})
        return [
            t
            for t in ("free", "paid", "enterprise")
            if not decide(v, "sim@1", t, utilization=1.0, thresholds_ms=THRESH).admit
        ]

    assert shed(100) == []
    assert shed(400) == ["free"]
    v = view(1000, {"paid": 700, "free": 1000})
    out = [
        t
        for t in ("free", "paid", "enterprise")
        if not decide(v, "sim@1", t, utilization=1.0, thresholds_ms=THRESH).admit
    ]
    assert out == ["free", "paid"]
    v = view(1000, {"enterprise": 2500})
    assert not decide(v, "sim@1", "enterprise", utilization=1.0, thresholds_ms=THRESH).admit


def test_retry_after_is_the_drain_time() -> None:
    d = decide(view(100, {"free": 500}), "sim@1", "free", utilization=1.0, thresholds_ms=THRESH)
    assert not d.admit and d.retry_after_s == pytest.approx(5.0)


def test_no_capacity_means_shed_when_work_waits() -> None:
    d = decide(view(0, {"paid": 1}), "sim@1", "paid", utilization=0.75, thresholds_ms=THRESH)
    assert not d.admit and math.isinf(d.predicted_delay_s) and d.retry_after_s == 5.0


def test_unknown_model_or_no_reports_admits() -> None:
    assert decide(None, "sim@1", "free", utilization=0.75, thresholds_ms=THRESH).admit
    assert decide(view(10, {}), "other@1", "free", utilization=0.75, thresholds_ms=THRESH).admit


def test_kafka_lag_counts_as_backlog() -> None:
    v = view(1000, {}, lag={"free": 600})
    assert not decide(v, "sim@1", "free", utilization=1.0, thresholds_ms=THRESH).admit
    assert decide(v, "sim@1", "paid", utilization=1.0, thresholds_ms=THRESH).admit


def test_capacity_follows_workers() -> None:
    cost = CostModel()
    ref = ("sim", "1")
    cost.seed(ref, {1: 100.0, 100: 100.0})
    assert best_throughput(cost, ref, 100) == pytest.approx(1000.0)
    two = capacity_by_model(cost, [{ref}, {ref}], {ref: 100})
    one = capacity_by_model(cost, [{ref}], {ref: 100})
    assert two == {"sim@1": 2000.0} and one == {"sim@1": 1000.0}


def test_combined_view_sums_schedulers() -> None:
    a = LoadReport({"sim@1": 100}, {"sim@1": {"free": 5}}, {"free": 1})
    b = LoadReport({"sim@1": 300}, {"sim@1": {"free": 7, "paid": 2}}, {"paid": 3})
    v = LoadView.combine([a, b])
    assert v.capacity == {"sim@1": 400} and v.backlog == {"sim@1": {"free": 12, "paid": 2}}
    assert v.lag == {"free": 1, "paid": 3}
