"""Rate limits and capacity from measured costs (admission: test_admission.py)."""

from __future__ import annotations

import pytest

from ingest.admission.ratelimit import TenantLimiter, TokenBucket
from scheduler.core.capacity import capacity_by_model
from scheduler.core.costmodel import CostModel


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


def test_capacity_follows_workers_and_reports_the_batch_shape() -> None:
    cost = CostModel()
    ref = ("sim", "1")
    cost.seed(ref, {1: 100.0, 100: 100.0})
    assert cost.throughput(ref, 100) == pytest.approx(1000.0)
    two = capacity_by_model(cost, [{ref}, {ref}], {ref: 100})
    one = capacity_by_model(cost, [{ref}], {ref: 100})
    assert two == {
        "sim@1": {
            "items_s": 2000.0,
            "batch": 100,
            "batch_ms": 100.0,
            "single_ms": 100.0,
            "workers": 2,
        }
    }
    assert one["sim@1"]["items_s"] == 1000.0 and one["sim@1"]["workers"] == 1
