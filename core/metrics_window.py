"""A process's own metrics over the last seconds, published for the dashboard page.

Once a second a scheduler, and each uvicorn process of an API instance, takes a
snapshot of the few metric families the dashboard shows and publishes, beside its
load report in PostgreSQL, each series' value now and its increase over the last
``WINDOW_S`` seconds; the API's dashboard endpoint sums what the live processes
published (ingest/dashboard_summary.py). Increases are taken inside the process, where
a counter never resets, so summing processes that start and stop stays exact
(decision 33). Pure: the caller passes the clock and the snapshot.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.metrics import Sample, Snapshot

# Rates on the page are increases over this many seconds (1 s steps): long enough that a
# few requests a second give a steady rate, short enough that a change shows within
# seconds (decision 33).
WINDOW_S = 10.0

# What each kind of process publishes: the sample names of the families the page shows.
SCHEDULER_COUNTERS = (
    "gristmill_requests_finished_total",
    "gristmill_stage_duration_seconds_bucket",
    "gristmill_stage_duration_seconds_count",
    "gristmill_batches_total",
    "gristmill_worker_busy_seconds_total",
)
SCHEDULER_GAUGES = (
    "gristmill_requests_queued",
    "gristmill_consumer_lag_messages",
    "gristmill_consumer_paused",
    "gristmill_oldest_message_age_seconds",
    "gristmill_worker_batches_in_flight",
    "gristmill_workers",
    "gristmill_gpu_utilization_ratio",
)
API_COUNTERS = (
    "gristmill_admission_total",
    "gristmill_api_responses_total",
    "gristmill_stage_duration_seconds_bucket",
    "gristmill_stage_duration_seconds_count",
    "gristmill_request_duration_seconds_bucket",
    "gristmill_request_duration_seconds_count",
    "gristmill_jobs_submitted_total",
    "gristmill_job_items_submitted_total",
)
API_GAUGES = ("gristmill_api_inflight_requests",)

LabelKey = tuple[tuple[str, str], ...]


def _key(labels: Mapping[str, str]) -> LabelKey:
    return tuple(sorted(labels.items()))


def _series(values: Mapping[str, Mapping[LabelKey, float]], *, nonzero: bool) -> dict[str, Any]:
    return {
        name: [[dict(k), v] for k, v in sorted(by.items()) if v or not nonzero]
        for name, by in sorted(values.items())
        if any(by.values()) or not nonzero
    }


@dataclass
class MetricsWindow:
    """``counters``: sample names that only grow (``_total``, histogram ``_bucket`` and
    ``_count``), published as totals and increases; ``gauges``: published as they are."""

    counters: tuple[str, ...]
    gauges: tuple[str, ...] = ()
    span_s: float = WINDOW_S
    _past: deque[tuple[float, dict[str, dict[LabelKey, float]]]] = field(default_factory=deque)

    def publish(self, now: float, snap: Snapshot) -> dict[str, Any]:
        """The publication for ``snap`` taken at ``now`` (epoch s): ``window_s`` (0 the first
        time), ``total`` and ``increase`` of the counters (nonzero series), ``gauges``."""
        current = {
            name: {_key(s.labels): s.value for s in snap.series(name)} for name in self.counters
        }
        self._past.append((now, current))
        # The base is the newest snapshot at least span_s old (the oldest while younger).
        while len(self._past) > 1 and now - self._past[1][0] >= self.span_s:
            self._past.popleft()
        base_at, base = self._past[0]
        increase = {
            name: {k: v - base.get(name, {}).get(k, 0.0) for k, v in by.items()}
            for name, by in current.items()
        }
        gauges = {
            name: {_key(s.labels): s.value for s in snap.series(name)} for name in self.gauges
        }
        return {
            "at": now,
            "window_s": now - base_at,
            "total": _series(current, nonzero=True),
            "increase": _series(increase, nonzero=True),
            "gauges": _series(gauges, nonzero=False),
        }


def snapshot_of(series: Mapping[str, Iterable[Any]], scale: float = 1.0) -> Snapshot:
    """A published part (``total``, ``increase``, ``gauges``) as a Snapshot, each value
    times ``scale`` (1 / window: increases as rates)."""
    snap = Snapshot()
    for name, pairs in series.items():
        snap.samples[name] = [Sample(dict(labels), float(v) * scale) for labels, v in pairs]
    return snap


def merged(snaps: Iterable[Snapshot]) -> Snapshot:
    """Several processes' snapshots as one: ``get`` then sums across them."""
    out = Snapshot()
    for snap in snaps:
        for name, samples in snap.samples.items():
            out.samples.setdefault(name, []).extend(samples)
    return out
