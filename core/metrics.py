"""What every process's Prometheus metrics share: names, buckets, label values, the
API's multiprocess directory, and reading current values in-process.

Each stage defines its own metrics in its own registry (ingest/metrics.py,
scheduler/runtime/metrics.py, results/metrics.py); the names they share are here, so the
API and the scheduler write the same histogram for the stages each of them sees.
Names follow Prometheus conventions: base units (seconds, bytes, ratios 0..1),
``_total`` on counters, and labels with a bounded set of values only (model,
version, tier, class, reason, stage, worker); never a tenant or a request id.
docs/observability.md lists every metric.
"""

from __future__ import annotations

import os
import shutil
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Histogram
    from prometheus_client.registry import Collector

# prometheus_client is imported inside the functions below, never at this module's
# import: the library picks single- or multi-process mode when it is first imported, and
# the process that starts the API imports this module before it sets the directory.

# The library's own switch: set before any metric exists, in every process that
# shares the directory (the API's uvicorn processes); read by prometheus_client.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Latency buckets (seconds): 1 ms to 30 s on a 1-2-5 scale. The tier SLOs (1, 2, 5 s)
# are bucket bounds, so "answered within the SLO" is a bucket count, exact.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0,
)  # fmt: skip
# Items per batch: powers of two up to the largest batch a model allows today (256).
BATCH_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
RATIO_BUCKETS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)

# One request's way through the system, in order. The scheduler observes the first four
# for every request it persists, the API the last for every sync answer it sends.
STAGES = ("queue", "batch_wait", "compute", "persist", "respond")

STAGE_SECONDS = "gristmill_stage_duration_seconds"
STAGE_HELP = (
    "Time a request spent in one stage: queue (API received -> scheduler consumed), "
    "batch_wait (consumed -> batch formed), compute (on the worker), persist (computed "
    "-> result committed), respond (committed -> answer sent)"
)
STAGE_LABELS = ("stage", "model", "version", "class")


def stage_histogram(registry: CollectorRegistry) -> Histogram:
    from prometheus_client import Histogram

    return Histogram(
        STAGE_SECONDS, STAGE_HELP, STAGE_LABELS, buckets=LATENCY_BUCKETS, registry=registry
    )


def observe_many(child: Histogram, values: Sequence[float], repeat: int = 1) -> None:
    """What ``child.observe(v)`` for each of ``values`` records (each ``repeat`` times),
    in one step.

    A scheduler observes four stages for every request it persists: at a GPU's rate
    (tens of thousands of requests a second per process) one ``observe`` call each cost
    more CPU than building the rows (docs/bench/gpu.md). prometheus_client has no batch
    observe, so this counts the values per bucket and adds the counts to the child's
    bucket and sum values, the ones ``observe`` adds to (tests/unit/core/test_metrics.py
    checks the two agree on the installed library)."""
    if not values or repeat < 1:
        return
    bounds: Sequence[float] = child._upper_bounds
    counts = [0] * len(bounds)
    total = 0.0
    for v in values:
        counts[bisect_left(bounds, v)] += repeat  # the first bound >= v, as observe's scan
        total += v
    child._raise_if_not_observable()
    child._sum.inc(total * repeat)
    buckets = child._buckets
    for i, n in enumerate(counts):
        if n:
            buckets[i].inc(n)


# ---- the API's several processes ------------------------------------------------------
def prepare_multiprocess_dir(path: Path) -> Path:
    """Empty ``path`` for a new set of API processes and return it.

    Files left by an earlier run would be summed into this run's counters: the
    directory must be fresh each time the processes start (the library's rule), so
    whoever starts them calls this, then sets ``PROMETHEUS_MULTIPROC_DIR`` to it."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def multiprocess_env(path: Path) -> dict[str, str]:
    """The environment that makes the processes about to start write their metrics to
    ``path``, emptied now (see ``prepare_multiprocess_dir``)."""
    return {MULTIPROC_ENV: str(prepare_multiprocess_dir(path))}


def multiprocess_dir() -> str | None:
    """The directory this process's metrics are written to, when it is one of several."""
    return os.environ.get(MULTIPROC_ENV) or None


# ---- reading current values (the dashboard, tests) -----------------------------------
@dataclass(frozen=True)
class Sample:
    labels: Mapping[str, str]
    value: float


@dataclass
class Snapshot:
    """Current values by sample name (``gristmill_x_total``, ``gristmill_y_bucket``)."""

    samples: dict[str, list[Sample]] = field(default_factory=dict)

    def get(self, name: str, **labels: str) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (0 if none)."""
        return sum(
            s.value
            for s in self.samples.get(name, [])
            if all(s.labels.get(k) == v for k, v in labels.items())
        )

    def series(self, name: str) -> list[Sample]:
        return list(self.samples.get(name, []))


def _collect(families: Iterable[object]) -> Snapshot:
    snap = Snapshot()
    for fam in families:
        for s in fam.samples:  # type: ignore[attr-defined]
            snap.samples.setdefault(s.name, []).append(Sample(dict(s.labels), float(s.value)))
    return snap


def snapshot(source: CollectorRegistry | Collector) -> Snapshot:
    """The current values of a registry (in this process; for the API's registry from
    ``ingest.operations.metrics.api_registry()``, every uvicorn process of the instance)."""
    return _collect(source.collect())


def parse_exposition(text: str) -> Snapshot:
    """A Snapshot of another process's ``/metrics`` text (e.g. a scheduler's)."""
    from prometheus_client.parser import text_string_to_metric_families

    return _collect(text_string_to_metric_families(text))
