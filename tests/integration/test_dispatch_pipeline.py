"""The scheduler's dispatch path against real sim worker processes: up to two batches
in flight per worker when batches are short (decision 0012), results persisted in
order, and a lost worker handing back everything it held."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.config import Settings
from core.messages import RequestMessage
from core.models.sim import sim_output
from core.vocab import PRIORITY_CLASSES
from scheduler.core.batcher import Batch, BatchKey, Pending
from scheduler.core.dispatch import DispatchCore
from scheduler.core.plans import PIPELINE_MAX_MS, Step, Worker
from scheduler.runtime.deadletter import Letter
from scheduler.runtime.persister import Persister
from scheduler.runtime.worker_threads import WorkerThreads
from scheduler.runtime.workerpool import WorkerHandle, WorkerPool

POISON = "@@poison@@"


class _Letters:
    def __init__(self) -> None:
        self.sent: list[Letter] = []

    def send(self, letters: list[Letter]) -> bool:
        self.sent.extend(letters)
        return True


class _Svc:
    """The scheduler's dispatch path as the service wires it (core, worker threads,
    persister) with real sim workers; rows are kept instead of written."""

    def __init__(
        self,
        batch_ms: float,
        n_workers: int = 1,
        max_batch: int = 8,
        timeout_s: float = 5,
        spawn: bool = True,  # False: the workers are started by hand and join
    ):
        self.core = DispatchCore.from_settings(Settings(max_linger_ms=5))
        self.cond = threading.Condition()
        self.letters = _Letters()
        self.rows: list[dict[str, Any]] = []
        self.writes: list[list[dict[str, Any]]] = []  # each transaction's rows
        self.batches: list[dict[str, Any]] = []
        self.rows_done = 0  # rows whose offsets are done
        self.max_seen_in_flight = 0
        self.ready = threading.Event()
        self.n_workers = n_workers
        self.stopping = threading.Event()
        self.persister = Persister(self._store, self.letters, self._done, self.stopping)
        self.threads = WorkerThreads(
            self.core, self.cond, self.persister.submit, batch_timeout_s=timeout_s
        )
        schedule = self.core.schedule

        def watched(w: Worker, now: float) -> Step:
            step = schedule(w, now)
            self.max_seen_in_flight = max(self.max_seen_in_flight, len(w.queue))
            return step

        self.core.schedule = watched  # type: ignore[method-assign]
        self.pool = WorkerPool(
            socket_path=Path(tempfile.mkdtemp(prefix="gm-test-")) / "w.sock",
            n_local=n_workers if spawn else 0,
            models=["sim"],
            on_ready=self._ready,
            env={
                "GRISTMILL_SIM_BATCH_MS": str(batch_ms),
                "GRISTMILL_SIM_MAX_BATCH": str(max_batch),
                "GRISTMILL_SIM_POISON_PREFIX": POISON,
            },
        )

    @property
    def handles(self) -> list[WorkerHandle]:
        return self.threads.handles

    def _ready(self, h: WorkerHandle) -> None:
        self.threads.add(h)
        if len(self.handles) >= self.n_workers:
            self.ready.set()

    def _store(self, rows: list[dict[str, Any]], brows: list[dict[str, Any]]) -> None:
        with self.cond:
            self.rows.extend(rows)
            self.writes.append(list(rows))
            self.batches.extend(brows)

    def _done(self, offsets: list[tuple[tuple[str, int], int]], n: int) -> None:
        with self.cond:
            self.core.done(offsets, n)
            self.rows_done += n
            self.cond.notify_all()

    def add(self, texts: list[str], start: int = 0, job_id: str | None = None) -> None:
        now = time.time()
        klass = "paid" if job_id is None else "jobs"
        key = BatchKey("sim", "1", (("salt", ""),))
        items = []
        for i, t in enumerate(texts, start):
            msg = RequestMessage(
                request_id=f"r{i}",
                tenant_id="t",
                priority="paid",
                model="sim",
                version="1",
                input=t,
                params={"salt": ""},
                deadline=now + 60,
                received_at=now,
                job_id=job_id,
                item_index=None if job_id is None else i,
            )
            items.append(Pending(msg, key, PRIORITY_CLASSES.index(klass), ("t", 0), i, now))
        with self.cond:
            self.core.accept(items, [], {("t", 0)})
            self.cond.notify_all()

    def wait_rows(self, n: int, timeout: float = 30) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.rows_done >= n, timeout), self.rows_done

    def close(self) -> None:
        with self.cond:
            self.core.stop_dispatching()
            self.cond.notify_all()
        self.threads.join(deadline=time.time() + 10)
        self.threads.stop_workers()
        self.persister.shutdown()
        self.pool.stop(timeout_s=10)


@pytest.fixture
def svc(request: pytest.FixtureRequest) -> Iterator[_Svc]:
    s = _Svc(*request.param)
    s.pool.start()
    assert s.ready.wait(60), "worker did not start"
    try:
        yield s
    finally:
        s.close()


@pytest.mark.parametrize("svc", [(5.0,)], indirect=True)
def test_short_batches_queue_a_second_batch_and_results_stay_in_order(svc: _Svc) -> None:
    with svc.cond:
        assert svc.core.may_queue(svc.core.workers[0])
    texts = [f"text {i}" for i in range(400)]
    svc.add(texts)
    svc.wait_rows(len(texts))
    assert svc.max_seen_in_flight == 2
    by_id = {r["request_id"]: r for r in svc.rows}
    assert len(by_id) == len(texts)
    for i, t in enumerate(texts):
        row = by_id[f"r{i}"]
        assert row["status"] == "succeeded" and row["output"] == sim_output(t)
        assert row["input"] == t
    # Offsets are done only once persisted: everything is committable now.
    assert svc.core.tracker.committable() == {("t", 0): len(texts)}
    # Compute times are the worker's one batch at a time, not time spent queued.
    assert all(b["compute_ms"] < 5 + 40 for b in svc.batches)


@pytest.mark.parametrize("svc", [(100.0, 1, 8)], indirect=True)
def test_a_mixed_batch_writes_its_sync_rows_first_in_their_own_transaction(svc: _Svc) -> None:
    """Decision 0013: sync rows of a batch topped up with job items are not held back
    by the job rows' larger write; every request still gets one row."""
    job = "00000000-0000-0000-0000-0000000000aa"
    with svc.cond:  # one batch: the dispatcher cannot take the job items alone
        svc.add([f"j{i}" for i in range(6)], start=0, job_id=job)
        svc.add(["s0", "s1"], start=6)
    svc.wait_rows(8)
    sync_ids = {"r6", "r7"}
    assert svc.writes[0] and {r["request_id"] for r in svc.writes[0]} == sync_ids
    assert all(r["job_id"] == job for w in svc.writes[1:] for r in w)
    assert sorted(r["request_id"] for r in svc.rows) == sorted(f"r{i}" for i in range(8))
    assert len({r["batch_id"] for r in svc.rows}) == 1 and len(svc.batches) == 1
    assert svc.core.tracker.committable() == {("t", 0): 8}


@pytest.mark.parametrize("svc", [(100.0,)], indirect=True)
def test_long_batches_run_one_at_a_time(svc: _Svc) -> None:
    """sim's 100 ms batches: a queued batch would hold back a sync arrival by a whole
    batch, so nothing is queued behind the running one."""
    with svc.cond:
        assert svc.core.cost.predict_ms(("sim", "1"), 8) > PIPELINE_MAX_MS
        assert not svc.core.may_queue(svc.core.workers[0])
    texts = [f"x{i}" for i in range(40)]
    svc.add(texts)
    svc.wait_rows(len(texts))
    assert svc.max_seen_in_flight == 1


@pytest.mark.parametrize("svc", [(20.0,)], indirect=True)
def test_a_crash_hands_back_the_queued_batch_unblamed(svc: _Svc) -> None:
    """The worker dies on the batch it computes: that batch counts an attempt; the one
    queued behind it never started and goes back unchanged (attempt not counted)."""
    good = [f"ok {i}" for i in range(16)]
    svc.add([POISON + "crash", *good[:7]])  # first batch: crashes the worker
    svc.add(good[7:], start=8)  # queued behind it
    svc.wait_rows(len(good) + 1, timeout=60)
    by_id = {r["request_id"]: r for r in svc.rows}
    assert by_id["r0"]["status"] == "failed"
    for i in range(1, 17):
        row = by_id[f"r{i}"]
        assert row["status"] == "succeeded", row
    # Items of the queued batch were never blamed: their first attempt is their only one.
    assert all(by_id[f"r{i}"]["attempts"] == 1 for i in range(8, 17))


@pytest.mark.parametrize("svc", [(20.0, 1, 8, 1.5)], indirect=True)
def test_a_hang_hands_back_the_queued_batch_unblamed(svc: _Svc) -> None:
    """A batch that hangs is timed from when the one before it returned; the worker is
    killed and the batch queued behind it goes back unchanged."""
    svc.add([POISON + "hang", *[f"a{i}" for i in range(1, 8)]])
    svc.add([f"b{i}" for i in range(8, 16)], start=8)
    svc.wait_rows(16, timeout=90)
    by_id = {r["request_id"]: r for r in svc.rows}
    assert by_id["r0"]["status"] == "failed"
    assert all(by_id[f"r{i}"]["status"] == "succeeded" for i in range(1, 16))
    assert all(by_id[f"r{i}"]["attempts"] == 1 for i in range(8, 16))


def test_batches_in_flight_compare_by_identity() -> None:
    k = BatchKey("sim", "1")
    a = Batch(key=k, items=[], formed_at=0.0, reason="full")
    b = Batch(key=k, items=[], formed_at=0.0, reason="full")
    assert a is not b and a.batch_id != b.batch_id


def test_succeeded_rows_match_request_row() -> None:
    from scheduler.runtime.rows import request_row, succeeded_rows

    now = time.time()
    key = BatchKey("sim", "1")
    items = []
    for i in range(5):
        msg = RequestMessage(
            request_id=f"r{i}",
            tenant_id="t",
            priority="paid",
            model="sim",
            version="1",
            input={"text": f"t{i}", "ids": "ab"} if i % 2 else f"t{i}",
            params={},
            deadline=now + 10 + i,
            received_at=now + i / 7,
        )
        msg.extra["produced_at"] = None if i == 3 else now
        items.append(Pending(msg, key, 1, ("t", 0), i, now))
    batch = Batch(key=key, items=items, formed_at=now, reason="full")
    outs = [[float(i)] for i in range(5)]
    got = succeeded_rows(batch, outs, now + 1, now + 2)
    want = [
        request_row(
            p, status="succeeded", output=o, batch=batch, compute_start=now + 1, compute_end=now + 2
        )
        for p, o in zip(items, outs, strict=True)
    ]
    assert got == want
