"""The dashboard's numbers from the windows several processes published: totals summed,
rates over each process's own window, percentiles as histogram_quantile gives them."""

from __future__ import annotations

import math
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from core.metrics import LATENCY_BUCKETS, snapshot, stage_histogram
from core.metrics_window import API_SERIES, SCHEDULER_SERIES, MetricsWindow
from ingest.operations.dashboard_summary import Published, quantile, summarize
from results.metrics import JobGauges

INF = math.inf


# ---- histogram_quantile ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("q", "buckets", "want"),
    [
        (0.5, [(0.1, 0), (0.2, 10), (INF, 10)], 0.15),  # linear inside (0.1, 0.2]
        (0.5, [(1.0, 4), (INF, 4)], 0.5),  # the first bucket starts at 0
        (0.99, [(1.0, 1), (INF, 10)], 1.0),  # in +Inf: the largest finite bound
        (0.95, [(0.1, 5), (0.2, 5), (0.5, 10), (INF, 10)], 0.47),
    ],
)
def test_quantile_interpolates_like_prometheus(
    q: float, buckets: list[tuple[float, float]], want: float
) -> None:
    got = quantile(q, buckets)
    assert got is not None and got == pytest.approx(want)


def test_quantile_of_nothing_is_none() -> None:
    assert quantile(0.5, []) is None
    assert quantile(0.5, [(0.1, 0), (INF, 0)]) is None


# ---- windows from real registries ----------------------------------------------------------
class Scheduler:
    """A scheduler's dashboard families in a registry of its own."""

    def __init__(self) -> None:
        self.reg = CollectorRegistry()
        self.stage = stage_histogram(self.reg)
        self.finished = Counter(
            "gristmill_requests_finished_total",
            "",
            ["model", "version", "class", "status"],
            registry=self.reg,
        )
        self.busy = Counter(
            "gristmill_worker_busy_seconds_total", "", ["worker"], registry=self.reg
        )
        self.window = MetricsWindow(SCHEDULER_SERIES)

    def publish(self, now: float) -> dict[str, Any]:
        return self.window.publish(now, snapshot(self.reg))


class Api:
    def __init__(self) -> None:
        self.reg = CollectorRegistry()
        self.admission = Counter(
            "gristmill_admission_total", "", ["tier", "outcome", "reason"], registry=self.reg
        )
        self.responses = Counter(
            "gristmill_api_responses_total", "", ["tier", "code"], registry=self.reg
        )
        self.total = Histogram(
            "gristmill_request_duration_seconds",
            "",
            ["model", "version", "class"],
            buckets=LATENCY_BUCKETS,
            registry=self.reg,
        )
        self.window = MetricsWindow(API_SERIES)

    def publish(self, now: float) -> dict[str, Any]:
        return self.window.publish(now, snapshot(self.reg))


def test_two_schedulers_and_two_api_processes_sum() -> None:
    s1, s2, a1, a2 = Scheduler(), Scheduler(), Api(), Api()
    pubs: dict[str, dict[str, Any]] = {}
    for name, p in {"s1": s1, "s2": s2, "a1": a1, "a2": a2}.items():
        pubs[name] = p.publish(0.0)
    # Ten seconds: s1 finishes 30 requests whose compute took 150 ms, s2 10 at 40 ms;
    # worker w1 computes for both (busy 4 s + 2 s), w2 for s2 only (1 s).
    for _ in range(30):
        s1.finished.labels("sim", "1", "paid", "succeeded").inc()
        s1.stage.labels("compute", "sim", "1", "paid").observe(0.15)
    for _ in range(10):
        s2.finished.labels("sim", "1", "paid", "succeeded").inc()
        s2.stage.labels("compute", "sim", "1", "paid").observe(0.04)
    s1.busy.labels("w1").inc(4)
    s2.busy.labels("w1").inc(2)
    s2.busy.labels("w2").inc(1)
    for api, n in ((a1, 25), (a2, 15)):
        api.admission.labels("paid", "admitted", "").inc(n)
        api.responses.labels("paid", "200").inc(n)
        for _ in range(n):
            api.total.labels("sim", "1", "paid").observe(0.3)
    a2.admission.labels("free", "429", "tenant_rate").inc(5)
    a2.responses.labels("free", "429").inc(5)
    pubs = {
        "s1": s1.publish(10.0),
        "s2": s2.publish(10.0),
        "a1": a1.publish(10.0),
        "a2": a2.publish(5.0),  # a younger window: its own length counts
    }
    published = [
        Published("scheduler" if k.startswith("s") else "api", k, v) for k, v in pubs.items()
    ]
    jobs = JobGauges({"running": 2, "queued": 1}, {"queued": 7, "succeeded": 3})
    d = summarize(published, jobs, now=10.0)

    t = d["throughput"]
    assert t["answered"] == 40 and t["admitted"] == 40
    assert t["answered_per_s"] == pytest.approx(25 / 10 + 15 / 5)
    assert t["finished"] == {"succeeded": 40}
    assert t["finished_per_s"]["succeeded"] == pytest.approx(4.0)
    assert d["processes"] == {"schedulers": 2, "api": 2}

    compute = next(r for r in d["latency"] if r["stage"] == "compute")
    assert compute["per_s"] == pytest.approx(4.0)
    assert 0.1 < compute["p50"] <= 0.2  # 30 of 40 in (0.1, 0.2]
    total = next(r for r in d["latency"] if r["stage"] == "total")
    assert 0.2 < total["p99"] <= 0.5
    queue = next(r for r in d["latency"] if r["stage"] == "queue")
    assert queue["per_s"] == 0 and queue["p50"] is None

    assert d["refusals"] == [
        {"tier": "free", "code": "429", "reason": "tenant_rate", "total": 5.0, "per_s": 1.0}
    ]
    workers = {w["worker"]: w for w in d["workers"]}
    assert workers["w1"]["busy"] == pytest.approx(0.6)  # 6 s of 10, across both schedulers
    assert workers["w2"]["busy"] == pytest.approx(0.1)
    assert d["jobs"] == {"jobs": jobs.jobs, "items": jobs.items}


def test_gauges_sum_over_schedulers_and_oldest_is_the_max() -> None:
    def pub(queued: float, lag: float, age: float) -> Published:
        return Published(
            "scheduler",
            "s",
            {
                "window_s": 0,
                "gauges": {
                    "gristmill_requests_queued": [
                        [{"model": "sim", "version": "1", "class": "paid"}, queued]
                    ],
                    "gristmill_consumer_lag_messages": [[{"class": "paid"}, lag]],
                    "gristmill_oldest_message_age_seconds": [
                        [{"model": "sim", "version": "1", "class": "paid"}, age]
                    ],
                    "gristmill_workers": [[{"state": "ready"}, 2], [{"state": "warming"}, 1]],
                },
            },
        )

    d = summarize([pub(3, 10, 0.5), pub(4, 5, 1.5)], None, now=0)
    assert d["queues"] == [
        {"class": "paid", "queued": 7.0, "lag": 15.0, "oldest_s": 1.5, "paused": False}
    ]
    assert d["workers_ready"] == 4 and d["workers_warming"] == 2
    assert d["jobs"] is None
    # first windows only: no rate yet, no division by zero
    assert d["throughput"]["answered_per_s"] == 0


def test_a_process_that_published_nothing_yet_is_left_out() -> None:
    d = summarize([Published("api", "a", {})], None, now=0)
    assert d["processes"] == {"schedulers": 0, "api": 0}


def test_buckets_a_window_left_out_still_bound_the_quantile() -> None:
    # Every request of the window took 150 ms: the buckets up to 0.1 s did not grow and
    # are not published; the median is still 150 ms, not 100 ms.
    s = Scheduler()
    s.publish(0.0)
    for _ in range(20):
        s.stage.labels("compute", "sim", "1", "paid").observe(0.15)
    window = s.publish(10.0)
    assert all(
        float(labels["le"]) > 0.1
        for labels, _ in window["increase"]["gristmill_stage_duration_seconds_bucket"]
    )
    d = summarize([Published("scheduler", "s", window)], None, now=10.0)
    compute = next(r for r in d["latency"] if r["stage"] == "compute")
    assert compute["p50"] == pytest.approx(0.15)
    assert compute["p99"] == pytest.approx(0.199)


def test_job_items_stages_are_kept_apart_from_sync_requests() -> None:
    s = Scheduler()
    s.publish(0.0)
    for _ in range(10):
        s.stage.labels("queue", "sim", "1", "jobs").observe(4.0)  # backfill waits
        s.stage.labels("queue", "sim", "1", "paid").observe(0.004)
        s.stage.labels("queue", "sim", "1", "free").observe(0.004)
    d = summarize([Published("scheduler", "s", s.publish(10.0))], None, now=10.0)
    sync = next(r for r in d["latency"] if r["stage"] == "queue")
    jobs = next(r for r in d["latency_jobs"] if r["stage"] == "queue")
    assert sync["per_s"] == pytest.approx(2.0) and 0.002 < sync["p99"] <= 0.005
    assert jobs["per_s"] == pytest.approx(1.0) and 2.0 < jobs["p50"] <= 5.0
    assert [r["stage"] for r in d["latency_jobs"]] == ["queue", "batch_wait", "compute", "persist"]


def test_re_embed_coverage_is_listed_per_version() -> None:
    jobs = JobGauges({}, {}, {("emb", "3"): 1.0, ("emb", "2"): 0.25})
    d = summarize([], jobs, now=1.0)
    assert d["coverage"] == [
        {"model": "emb", "version": "2", "coverage": 0.25},
        {"model": "emb", "version": "3", "coverage": 1.0},
    ]
    assert summarize([], None, now=1.0)["coverage"] == []  # gauges unreadable: none shown
