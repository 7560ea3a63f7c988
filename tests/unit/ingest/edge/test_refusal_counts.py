"""Refusals counted per second, tenant and reason; answer timeouts buffered; both bounded."""

from __future__ import annotations

from core.errors import (
    DeadlineExceeded,
    InvalidInput,
    RateLimited,
    Unauthorized,
    Unavailable,
)
from ingest.edge.refusal_counts import (
    RefusalCounts,
    RefusalKey,
    Timeout,
    TimeoutLog,
    current_tenant,
    reason_of,
)

T = 1_790_000_000.0
ACME = ("t-acme", "paid")


def test_reasons_are_the_errors_own_metric_labels() -> None:
    assert reason_of(Unauthorized("unknown or revoked API key")) == "unauthorized"
    assert reason_of(RateLimited("rate limit of 5 requests/s exceeded")) == "tenant_rate"
    assert reason_of(DeadlineExceeded("no result within timeout_ms=10")) == "deadline"
    assert reason_of(DeadlineExceeded("dropped", reason="expired")) == "expired"
    assert reason_of(Unavailable("overloaded: ...", reason="predicted_delay")) == (
        "predicted_delay"
    )
    assert reason_of(Unavailable("ingest queue to Kafka is full", reason="kafka")) == "kafka"
    assert reason_of(Unavailable("something new")) == "unavailable"
    assert reason_of(InvalidInput("x")) == "invalid_input"


def test_one_count_per_second_tenant_status_and_reason() -> None:
    log = RefusalCounts()
    for i in range(1000):
        log.record(T + i / 2000, 429, "tenant_rate", ACME)  # 1,000 in half a second
    log.record(T + 0.9, 503, "predicted_delay", ACME)
    log.record(T + 1.2, 429, "tenant_rate", ACME)
    log.record(T + 0.1, 401, "unauthorized", None)
    assert log.drain(T + 0.95) == []  # its second is not over
    got = dict(log.drain(T + 1.5))
    assert got == {
        RefusalKey(int(T), "t-acme", "paid", 429, "tenant_rate"): 1000,
        RefusalKey(int(T), "t-acme", "paid", 503, "predicted_delay"): 1,
        RefusalKey(int(T), None, None, 401, "unauthorized"): 1,
    }
    assert dict(log.drain(T + 5, everything=True)) == {
        RefusalKey(int(T) + 1, "t-acme", "paid", 429, "tenant_rate"): 1
    }
    assert log.pending() == 0


def test_past_the_cap_new_tenants_fold_into_the_tenantless_count() -> None:
    log = RefusalCounts(max_keys=3)
    for i in range(10):
        log.record(T, 429, "tenant_rate", (f"t{i}", "free"))
    got = dict(log.drain(T + 1))
    assert sum(got.values()) == 10 and len(got) == 4
    assert got[RefusalKey(int(T), None, "free", 429, "tenant_rate")] == 7
    assert log.folded == 7


def test_a_failed_write_puts_its_counts_back() -> None:
    log = RefusalCounts()
    log.record(T, 503, "kafka", ACME)
    drained = log.drain(T + 1)
    log.record(T, 503, "kafka", ACME)
    log.restore(drained)
    assert dict(log.drain(T + 1)) == {RefusalKey(int(T), "t-acme", "paid", 503, "kafka"): 2}


def test_timeouts_are_kept_until_written_and_bounded() -> None:
    log = TimeoutLog(max_pending=2)
    ts = [Timeout(f"r{i}", "t", T, T + 1) for i in range(3)]
    for t in ts:
        log.record(t)
    assert log.dropped == 1
    got = log.drain()
    assert got == ts[:2] and log.drain() == []
    log.record(ts[2])
    log.restore(got)  # room for one of the two
    assert log.drain() == [ts[0], ts[2]] and log.dropped == 2


def test_the_tenant_of_the_request_is_a_context_variable() -> None:
    assert current_tenant.get() is None
    token = current_tenant.set(ACME)
    assert current_tenant.get() == ACME
    current_tenant.reset(token)
