"""What the dashboard page shows, from the metrics windows the live processes published
(core/metrics_window.py) and the job gauges. Pure: unit-tested on hand-made windows.

Counts are totals over the live processes (since each started); rates are the sum over
processes of each one's increase divided by its own window, as Prometheus'
``sum(rate(...))`` would give; percentiles interpolate inside histogram buckets as
``histogram_quantile`` does, over the requests of the window.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.metrics import LATENCY_BUCKETS, STAGES, Snapshot
from core.metrics_window import merged, snapshot_of
from results.metrics import JobGauges

QUANTILES = (0.5, 0.95, 0.99)
TOTAL = "total"  # the whole sync request, received -> answered (after the stages)


@dataclass(frozen=True)
class Published:
    """One live process's latest publication."""

    kind: str  # "scheduler" or "api"
    process: str
    window: Mapping[str, Any]


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """``histogram_quantile``: ``buckets`` are (upper bound, cumulative count) with
    +Inf last; linear inside the bucket the rank falls in, the largest finite bound if
    it falls in +Inf; None with no observations."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            if count == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


def _buckets(rates: Snapshot, name: str, **labels: str) -> list[tuple[float, float]]:
    """A histogram's buckets summed over its series; every bound of the layout is there:
    a window leaves out a bucket whose increase is 0 (so are those below it), and
    without it the next bucket would seem to start at 0."""
    by_le: dict[float, float] = {}
    if rates.series(name):
        by_le = dict.fromkeys((*LATENCY_BUCKETS, math.inf), 0.0)
    for s in rates.series(name):
        if all(s.labels.get(k) == v for k, v in labels.items()):
            le = float(s.labels["le"])
            by_le[le] = by_le.get(le, 0.0) + s.value
    return sorted(by_le.items())


def _by(snap: Snapshot, name: str, *keys: str) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for s in snap.series(name):
        k = tuple(s.labels.get(key, "") for key in keys)
        out[k] = out.get(k, 0.0) + s.value
    return out


def _latency_row(name: str, rates: Snapshot, metric: str, **labels: str) -> dict[str, Any]:
    buckets = _buckets(rates, metric, **labels)
    return {
        "stage": name,
        "per_s": buckets[-1][1] if buckets else 0.0,
        **{f"p{round(q * 100)}": quantile(q, buckets) for q in QUANTILES},
    }


def summarize(published: Iterable[Published], jobs: JobGauges | None, now: float) -> dict[str, Any]:
    """The page's numbers: throughput, latency by stage (sync requests; job items apart),
    queues and lag, refusals, workers, jobs."""
    pubs = [p for p in published if p.window]
    totals = merged(snapshot_of(p.window.get("total", {})) for p in pubs)
    # Increases as rates, each over its own window; a process's first window is empty.
    rates = merged(
        snapshot_of(p.window.get("increase", {}), 1.0 / float(p.window["window_s"]))
        for p in pubs
        if float(p.window.get("window_s", 0)) > 0
    )
    gauges = merged(snapshot_of(p.window.get("gauges", {})) for p in pubs)
    windows = [float(p.window.get("window_s", 0)) for p in pubs]

    finished = _by(totals, "gristmill_requests_finished_total", "status")
    finished_rate = _by(rates, "gristmill_requests_finished_total", "status")
    codes = _by(totals, "gristmill_api_responses_total", "code")
    codes_rate = _by(rates, "gristmill_api_responses_total", "code")
    throughput = {
        "answered": codes.get(("200",), 0.0),
        "answered_per_s": codes_rate.get(("200",), 0.0),
        "admitted": totals.get("gristmill_admission_total", outcome="admitted"),
        "admitted_per_s": rates.get("gristmill_admission_total", outcome="admitted"),
        "finished": {k[0]: v for k, v in sorted(finished.items())},
        "finished_per_s": {k[0]: v for k, v in sorted(finished_rate.items())},
        "by_code": {k[0]: v for k, v in sorted(codes.items())},
        "jobs_submitted": totals.get("gristmill_jobs_submitted_total"),
        "job_items_per_s": rates.get("gristmill_job_items_submitted_total"),
    }

    stages = "gristmill_stage_duration_seconds_bucket"
    latency = [_latency_row(st, rates, stages, stage=st, lane="sync") for st in STAGES]
    latency.append(_latency_row(TOTAL, rates, "gristmill_request_duration_seconds_bucket"))
    # job items: read -> persisted (they are not answered one by one)
    latency_jobs = [_latency_row(st, rates, stages, stage=st, lane="jobs") for st in STAGES[:4]]

    queued = _by(gauges, "gristmill_requests_queued", "class")
    lag = _by(gauges, "gristmill_consumer_lag_messages", "class")
    paused = _by(gauges, "gristmill_consumer_paused", "class")
    oldest: dict[str, float] = {}
    for s in gauges.series("gristmill_oldest_message_age_seconds"):
        c = s.labels.get("class", "")
        oldest[c] = max(oldest.get(c, 0.0), s.value)
    classes = sorted({k[0] for k in queued} | {k[0] for k in lag} | set(oldest))
    queues = [
        {
            "class": c,
            "queued": queued.get((c,), 0.0),
            "lag": lag.get((c,), 0.0),
            "oldest_s": oldest.get(c, 0.0),
            "paused": paused.get((c,), 0.0) > 0,
        }
        for c in classes
    ]

    refused_total = _by(totals, "gristmill_admission_total", "tier", "outcome", "reason")
    refused_rate = _by(rates, "gristmill_admission_total", "tier", "outcome", "reason")
    refusals = [
        {"tier": t, "code": o, "reason": r, "total": n, "per_s": refused_rate.get((t, o, r), 0.0)}
        for (t, o, r), n in sorted(refused_total.items())
        if o != "admitted"
    ]

    busy = _by(rates, "gristmill_worker_busy_seconds_total", "worker")
    in_flight = _by(gauges, "gristmill_worker_batches_in_flight", "worker")
    gpu: dict[tuple[str, ...], float] = {}  # a worker serving two schedulers: one GPU
    for s in gauges.series("gristmill_gpu_utilization_ratio"):
        k = (s.labels.get("worker", ""),)
        gpu[k] = max(gpu.get(k, 0.0), s.value)
    workers = [
        {
            "worker": w,
            "busy": min(1.0, busy.get((w,), 0.0)),
            "in_flight": in_flight.get((w,), 0.0),
            "gpu_utilization": gpu.get((w,)),
        }
        for w in sorted({k[0] for k in busy} | {k[0] for k in in_flight})
    ]

    return {
        "at": now,
        "window_s": max(windows, default=0.0),
        "processes": {
            "schedulers": sum(1 for p in pubs if p.kind == "scheduler"),
            "api": sum(1 for p in pubs if p.kind == "api"),
        },
        "throughput": throughput,
        "latency": latency,
        "latency_jobs": latency_jobs,
        "queues": queues,
        "refusals": refusals,
        "workers": workers,
        "workers_ready": gauges.get("gristmill_workers", state="ready"),
        "workers_warming": gauges.get("gristmill_workers", state="warming"),
        "inflight": gauges.get("gristmill_api_inflight_requests"),
        "jobs": None if jobs is None else {"jobs": jobs.jobs, "items": jobs.items},
        # Re-embeds (decision 68): each version's share of its corpora embedded so far.
        "coverage": []
        if jobs is None
        else [
            {"model": m, "version": v, "coverage": share}
            for (m, v), share in sorted(jobs.coverage.items())
        ],
    }
