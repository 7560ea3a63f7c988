"""A process's own metrics over the last seconds, published for the dashboard page.

Once a second a scheduler, and each uvicorn process of an API instance, takes a
snapshot of the few metric families the dashboard shows, sums away the labels the page
does not show, and publishes, beside its load report in PostgreSQL, each series' value
now and its increase over the last ``WINDOW_S`` seconds; the API's dashboard endpoint
sums what the live processes published (ingest/operations/dashboard_summary.py). Increases are
taken inside the process, where a counter never resets, so summing processes that start
and stop stays exact (decision 33). Pure: the caller passes the clock and the snapshot.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.metrics import Sample, Snapshot
from core.vocab import PriorityClass

# Rates on the page are increases over this many seconds (1 s steps): long enough that a
# few requests a second give a steady rate, short enough that a change shows within
# seconds (decision 33).
WINDOW_S = 10.0


@dataclass(frozen=True)
class Series:
    """One sample name as a process publishes it: only the labels ``by`` kept, the
    others summed (``peak``: their maximum). A ``counter`` (``_total``, a histogram's
    ``_bucket``) is published as its increase over the window and, with ``total``, its
    value since the process started; anything else as its value now."""

    name: str
    by: tuple[str, ...] = ()
    counter: bool = True
    total: bool = True
    peak: bool = False
    # The class label kept as "sync" (every tier) or "jobs": job items wait by design, so
    # their stages are not mixed into the sync requests' (and tiers cost no more series).
    lane: bool = False


# What each kind of process publishes: the page's numbers, summed over the labels it does
# not show (a few kB a second however many models, classes and workers there are).
LATENCY = ("stage", "le")
SCHEDULER_SERIES = (
    Series("gristmill_requests_finished_total", ("status",)),
    Series("gristmill_stage_duration_seconds_bucket", LATENCY, total=False, lane=True),
    Series("gristmill_batches_total", ("reason",)),
    Series("gristmill_worker_busy_seconds_total", ("worker",)),
    Series("gristmill_requests_queued", ("class",), counter=False),
    Series("gristmill_consumer_lag_messages", ("class",), counter=False),
    Series("gristmill_consumer_paused", ("class",), counter=False, peak=True),
    Series("gristmill_oldest_message_age_seconds", ("class",), counter=False, peak=True),
    Series("gristmill_worker_batches_in_flight", ("worker",), counter=False),
    Series("gristmill_workers", ("state",), counter=False),
    Series("gristmill_gpu_utilization_ratio", ("worker",), counter=False, peak=True),
)
API_SERIES = (
    Series("gristmill_admission_total", ("tier", "outcome", "reason")),
    Series("gristmill_api_responses_total", ("code",)),
    Series("gristmill_stage_duration_seconds_bucket", LATENCY, total=False, lane=True),
    Series("gristmill_request_duration_seconds_bucket", ("le",), total=False),
    Series("gristmill_jobs_submitted_total"),
    Series("gristmill_job_items_submitted_total"),
    Series("gristmill_api_inflight_requests", counter=False),
)

LabelKey = tuple[tuple[str, str], ...]
Values = dict[str, dict[LabelKey, float]]


def _reduce(series: Series, snap: Snapshot) -> dict[LabelKey, float]:
    out: dict[LabelKey, float] = {}
    for s in snap.series(series.name):
        k = tuple((label, s.labels.get(label, "")) for label in series.by)
        if series.lane:
            k += (("lane", "jobs" if s.labels.get("class") == PriorityClass.JOBS else "sync"),)
        out[k] = max(out.get(k, s.value), s.value) if series.peak else out.get(k, 0.0) + s.value
    return out


def _listed(values: Values, *, nonzero: bool) -> dict[str, Any]:
    return {
        name: [[dict(k), v] for k, v in sorted(by.items()) if v or not nonzero]
        for name, by in sorted(values.items())
        if any(by.values()) or not nonzero
    }


@dataclass
class MetricsWindow:
    series: tuple[Series, ...]
    span_s: float = WINDOW_S
    _past: deque[tuple[float, Values]] = field(default_factory=deque)

    def names(self) -> list[str]:
        return sorted({s.name for s in self.series})

    def publish(self, now: float, snap: Snapshot) -> dict[str, Any]:
        """The publication for ``snap`` taken at ``now`` (epoch s): ``window_s`` (0 the first
        time), ``total`` and ``increase`` of the counters (nonzero series), ``gauges``."""
        counters = {s.name: _reduce(s, snap) for s in self.series if s.counter}
        self._past.append((now, counters))
        # The base is the newest snapshot at least span_s old (the oldest while younger).
        while len(self._past) > 1 and now - self._past[1][0] >= self.span_s:
            self._past.popleft()
        base_at, base = self._past[0]
        increase = {
            name: {k: v - base.get(name, {}).get(k, 0.0) for k, v in by.items()}
            for name, by in counters.items()
        }
        totals = {s.name: counters[s.name] for s in self.series if s.counter and s.total}
        gauges = {s.name: _reduce(s, snap) for s in self.series if not s.counter}
        return {
            "at": now,
            "window_s": now - base_at,
            "total": _listed(totals, nonzero=True),
            "increase": _listed(increase, nonzero=True),
            "gauges": _listed(gauges, nonzero=False),
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
