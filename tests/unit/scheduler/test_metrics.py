"""scheduler/runtime/metrics.py: what a computed and persisted batch adds, and the gauges of a
hand-made scheduler state."""

from __future__ import annotations

import time

from core.messages import RequestMessage
from core.metrics import snapshot
from core.protocol import WorkResult
from core.vocab import ModelRef, RequestStatus
from scheduler.core.batcher import Batch, BatchKey, Pending
from scheduler.runtime import metrics
from scheduler.runtime.rows import request_row, succeeded_rows

SIM = ModelRef("sim", "1")


def pending(i: int, priority: str, received: float, consumed: float) -> Pending:
    msg = RequestMessage(
        request_id=f"00000000-0000-0000-0000-{i:012d}",
        tenant_id="t",
        priority=priority,
        model="sim",
        version="1",
        input=f"x{i}",
        params={},
        deadline=received + 5,
        received_at=received,
    )
    return Pending(msg, BatchKey("sim", "1"), 1, ("topic", 0), i, consumed)


def test_a_persisted_batch_adds_each_stage_once_per_request() -> None:
    t0 = time.time() - 1.0
    items = [pending(i, "paid", t0, t0 + 0.010) for i in range(3)]
    batch = Batch(BatchKey("sim", "1"), items, formed_at=t0 + 0.060, reason="linger")
    rows = succeeded_rows(batch, ["a", "b", "c"], t0 + 0.070, t0 + 0.220)
    before = snapshot(metrics.REGISTRY)
    result = WorkResult(batch.batch_id, ["a", "b", "c"], None, t0 + 0.07, t0 + 0.22)
    metrics.batch_done("w0", batch, result, {SIM: 10})
    store = metrics.timed_store(lambda rows, brow: len(rows))
    assert store(rows, None) == 3
    metrics.persisted(rows, now=t0 + 0.230)
    after = snapshot(metrics.REGISTRY)

    def added(name: str, **labels: str) -> float:
        return after.get(name, **labels) - before.get(name, **labels)

    for stage in ("queue", "batch_wait", "compute", "persist"):
        assert (
            added("gristmill_stage_duration_seconds_count", stage=stage, **{"class": "paid"}) == 3
        )
    # compute 150 ms each: the three land in the 0.2 s bucket, not in the 0.1 s one
    assert added("gristmill_stage_duration_seconds_bucket", stage="compute", le="0.2") == 3
    assert added("gristmill_stage_duration_seconds_bucket", stage="compute", le="0.1") == 0
    assert added("gristmill_stage_duration_seconds_sum", stage="queue") == pytest_approx(0.030)
    assert added("gristmill_requests_finished_total", status="succeeded") == 3
    assert added("gristmill_batches_total", reason="linger") == 1
    assert added("gristmill_batch_size_sum", model="sim") == 3
    assert added("gristmill_batch_fill_ratio_sum", model="sim") == pytest_approx(0.3)
    assert added("gristmill_worker_busy_seconds_total", worker="w0") == pytest_approx(0.15)
    assert added("gristmill_persist_duration_seconds_count") == 1


def test_expired_requests_count_as_finished_without_stages() -> None:
    t0 = time.time() - 1.0
    p = pending(9, "free", t0, t0 + 0.01)
    before = snapshot(metrics.REGISTRY)
    metrics.persisted([request_row(p, status=RequestStatus.EXPIRED, error="late")])
    after = snapshot(metrics.REGISTRY)
    labels = {"class": "free", "status": "expired"}
    assert (
        after.get("gristmill_requests_finished_total", **labels)
        - before.get("gristmill_requests_finished_total", **labels)
        == 1
    )
    compute = {"stage": "compute", "class": "free"}
    assert after.get("gristmill_stage_duration_seconds_count", **compute) == before.get(
        "gristmill_stage_duration_seconds_count", **compute
    )


def pytest_approx(x: float) -> object:
    import pytest

    return pytest.approx(x, abs=1e-4)  # datetimes keep microseconds


def families(state: metrics.SchedulerState) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in metrics.gauge_families(state):
        out[fam.name] = [(dict(s.labels), s.value) for s in fam.samples]
    return out


def test_gauges_show_ages_queues_lag_and_workers() -> None:
    now = 1000.0
    state = metrics.SchedulerState(
        now=now,
        served={SIM},
        queued={(SIM, 1): 7},
        oldest={(SIM, 1): now - 0.4, (SIM, 3): now - 30.0},
        lag={"enterprise": 0, "paid": 120, "free": 5, "jobs": 9000},
        paused={"jobs"},
        in_flight={"w0": 2, "w1": 0},
        workers={"w0": {SIM}, "w1": {SIM}},
        warming=1,
    )
    f = families(state)
    age = {s[0]["class"]: s[1] for s in f["gristmill_oldest_message_age_seconds"]}
    # every class of every served model has a series: 0 when nothing waits
    assert age == {"enterprise": 0.0, "paid": pytest_approx(0.4), "free": 0.0, "jobs": 30.0}
    queued = {s[0]["class"]: s[1] for s in f["gristmill_requests_queued"]}
    assert queued == {"enterprise": 0, "paid": 7, "free": 0, "jobs": 0}
    assert dict((s[0]["class"], s[1]) for s in f["gristmill_consumer_lag_messages"])["paid"] == 120
    assert [s for s in f["gristmill_consumer_paused"] if s[1] == 1.0] == [({"class": "jobs"}, 1.0)]
    assert {s[0]["worker"]: s[1] for s in f["gristmill_worker_batches_in_flight"]} == {
        "w0": 2,
        "w1": 0,
    }
    assert {s[0]["state"]: s[1] for s in f["gristmill_workers"]} == {"ready": 2, "warming": 1}
    assert f["gristmill_model_workers"] == [({"model": "sim", "version": "1"}, 2)]


def test_a_model_without_workers_shows_zero_workers_not_nothing() -> None:
    state = metrics.SchedulerState(
        now=0.0, served={SIM}, queued={}, oldest={}, lag={}, paused=set(), in_flight={},
        workers={}, warming=0,
    )  # fmt: skip
    assert families(state)["gristmill_model_workers"] == [({"model": "sim", "version": "1"}, 0)]


def test_gpu_readings_older_than_a_scrape_interval_are_not_shown() -> None:
    sample = {"gpu": "0", "utilization": 0.8, "memory_used_bytes": 1e9, "memory_total_bytes": 8e10}
    fams = {
        f.name: f.samples
        for f in metrics.device_families(
            {"fresh": (sample, 100.0), "stale": (sample, 100.0 - metrics.DEVICE_FRESH_S - 1)}, 100.0
        )
    }
    assert [(s.labels["worker"], s.value) for s in fams["gristmill_gpu_utilization_ratio"]] == [
        ("fresh", 0.8)
    ]
    assert [s.value for s in fams["gristmill_gpu_memory_total_bytes"]] == [8e10]


def test_a_failed_batch_and_a_lost_worker_count_as_batch_failures() -> None:
    t0 = time.time()
    a = Batch(BatchKey("sim", "1"), [pending(1, "paid", t0, t0)], formed_at=t0, reason="full")
    b = Batch(BatchKey("sim", "1"), [pending(2, "paid", t0, t0)], formed_at=t0, reason="full")
    before = snapshot(metrics.REGISTRY).get("gristmill_batch_failures_total", model="sim")
    metrics.batch_done("w1", a, WorkResult(a.batch_id, None, "boom", t0, t0 + 0.01), {SIM: 10})
    metrics.worker_lost([a, b], ran=True, error="crashed")  # the first ran, b was queued
    metrics.worker_lost([b], ran=False, error="gone")  # never reached the worker
    after = snapshot(metrics.REGISTRY).get("gristmill_batch_failures_total", model="sim")
    assert after - before == 2
