"""core/metrics.py and core/tracing.py: buckets, the multiprocess directory, reading
values back, error reasons, and trace context parsing while tracing is off."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from core import tracing
from core.config import Settings
from core.errors import DeadlineExceeded, RateLimited, Unavailable
from core.metrics import (
    LATENCY_BUCKETS,
    MULTIPROC_ENV,
    multiprocess_env,
    parse_exposition,
    snapshot,
)


def test_latency_buckets_span_1ms_to_30s_and_hold_every_tier_slo() -> None:
    assert LATENCY_BUCKETS[0] == 0.001 and LATENCY_BUCKETS[-1] == 30.0
    assert list(LATENCY_BUCKETS) == sorted(LATENCY_BUCKETS)
    # "answered within the SLO" is an exact bucket count only if each SLO is a bound
    for slo_ms in Settings().tier_slo_ms.values():
        assert slo_ms / 1000 in LATENCY_BUCKETS


def test_multiprocess_dir_is_emptied_at_every_start(tmp_path: Path) -> None:
    d = tmp_path / "api.metrics"
    d.mkdir()
    (d / "counter_123.db").write_bytes(b"old run")
    env = multiprocess_env(d)
    assert env == {MULTIPROC_ENV: str(d)}
    assert d.is_dir() and not any(d.iterdir())
    assert multiprocess_env(tmp_path / "new") == {MULTIPROC_ENV: str(tmp_path / "new")}


def test_snapshot_and_exposition_read_the_same_values() -> None:
    reg = CollectorRegistry()
    c = Counter("demo_total", "d", ["tier", "outcome"], registry=reg)
    c.labels("paid", "admitted").inc(3)
    c.labels("free", "admitted").inc(2)
    c.labels("free", "429").inc()
    for snap in (snapshot(reg), parse_exposition(generate_latest(reg).decode())):
        assert snap.get("demo_total") == 6
        assert snap.get("demo_total", outcome="admitted") == 5
        assert snap.get("demo_total", tier="free", outcome="429") == 1
        assert snap.get("demo_total", tier="enterprise") == 0
        assert len(snap.series("demo_total")) == 3


def test_errors_carry_a_reason_for_the_refusal_metrics() -> None:
    assert RateLimited("over").reason == "tenant_rate"
    assert Unavailable("down").reason == "unavailable"
    assert Unavailable("down", reason="kafka").reason == "kafka"
    assert DeadlineExceeded("late").reason == "deadline"
    assert DeadlineExceeded("late", reason="expired").reason == "expired"


def test_tracing_is_off_by_default_and_costs_no_headers() -> None:
    assert Settings().otlp_traces_endpoint == ""
    assert not tracing.setup(Settings(), "test")
    assert not tracing.enabled()
    assert tracing.headers() is None


def test_trace_context_is_read_from_kafka_headers() -> None:
    tid, sid = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    ctx = tracing.context_from_headers([("traceparent", f"00-{tid}-{sid}-01".encode())])
    assert ctx is not None
    from opentelemetry import trace

    sc = trace.get_current_span(ctx).get_span_context()
    assert (f"{sc.trace_id:032x}", f"{sc.span_id:016x}", sc.is_remote) == (tid, sid, True)
    assert tracing.context_from_headers([("traceparent", b"garbage")]) is None
    assert tracing.context_from_headers([("other", b"x")]) is None
    assert tracing.context_from_headers(None) is None


def test_observe_many_records_what_one_observe_per_value_records() -> None:
    """observe_many adds to the library's own bucket and sum values: if a new
    prometheus_client stores them differently, this fails."""
    import random

    from core.metrics import observe_many

    rng = random.Random(7)
    values = [rng.choice([0.0, 0.001, 0.002, 5.0, 30.0, 31.0]) for _ in range(50)]
    values += [rng.expovariate(5.0) for _ in range(500)]
    one, many = CollectorRegistry(), CollectorRegistry()
    h1 = Histogram("x_seconds", "x", ["m"], buckets=LATENCY_BUCKETS, registry=one)
    h2 = Histogram("x_seconds", "x", ["m"], buckets=LATENCY_BUCKETS, registry=many)
    for v in values:
        h1.labels("a").observe(v)
    for _ in range(3):
        h1.labels("a").observe(0.004)
    observe_many(h2.labels("a"), [0.004], repeat=3)
    observe_many(h2.labels("a"), values[:100])
    observe_many(h2.labels("a"), values[100:])
    observe_many(h2.labels("a"), [])

    def sampled(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
        snap = snapshot(registry)
        return {
            (name, s.labels.get("le", "")): s.value
            for name, samples in snap.samples.items()
            if not name.endswith("_created")
            for s in samples
        }

    a, b = sampled(one), sampled(many)
    assert a.keys() == b.keys() and len(a) == len(LATENCY_BUCKETS) + 3  # +Inf, count, sum
    for key, value in a.items():
        assert b[key] == pytest.approx(value), key
