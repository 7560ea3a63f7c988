"""Observability and the durability ledger."""

from __future__ import annotations

from pydantic import (
    Field,
)

from core.config._base import _Concern


class ObservabilitySettings(_Concern):
    """Metrics and traces (core/metrics.py, core/tracing.py, docs/observability.md)."""

    # The scheduler's Prometheus endpoint (the API serves /metrics on its own port).
    # Deployments listen on 0.0.0.0; several schedulers on one host need a port each.
    # 0: no endpoint.
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(9464, ge=0, le=65_535)
    # OTLP/HTTP traces endpoint (e.g. http://collector:4318/v1/traces); empty: tracing is
    # off and costs nothing. On: spans of the API, scheduler and workers carry the W3C
    # trace context of the request through Kafka headers.
    otlp_traces_endpoint: str = ""
    # Requests that come without a sampled traceparent are traced with this probability.
    trace_sample_ratio: float = Field(1.0, ge=0, le=1)
    # An API process logs what its event loop was running whenever the loop runs no
    # timer for longer than this (ingest/operations/stalls.py); 0: off.
    loop_stall_log_ms: float = Field(0.0, ge=0)


class LedgerSettings(_Concern):
    """The durability ledger (gristmill/ledger/, decision 54)."""

    # Past its deadline plus this, a request without a terminal row is overdue (alerted):
    # the scheduler writes an ``expired`` row for one it cannot run in time, so the grace
    # covers a scheduler's restart (drain, rejoin, re-read) before that row is due (s).
    ledger_grace_s: float = Field(60.0, ge=0)
    # The ledger's Prometheus endpoint (host as metrics_host); 0: none.
    ledger_metrics_port: int = Field(9465, ge=0, le=65_535)
    # Messages one partition may hold in memory behind one not yet reconciled; the
    # partition's reading pauses there (a backlog of job items waits in Kafka instead).
    ledger_window: int = Field(50_000, ge=2)
    # How often counts, positions and pending are stored (s).
    ledger_store_interval_s: float = Field(2.0, gt=0)
