"""core/metrics.py and core/tracing.py: buckets, the multiprocess directory, reading
values back, error reasons, and trace context parsing while tracing is off."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, generate_latest

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
