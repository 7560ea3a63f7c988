"""The dispatch core (scheduler/core/dispatch.py) on a fake clock: hand-built fetches,
results, failures and lost workers; no processes, no sockets, no sleeps.

Decisions covered: 11 (a free worker flushes a lingering sync queue before starting
job items; job batches start staggered across workers), 12 (a second batch queues on a
busy worker only when batches are short; a lost worker hands back what it held), 13 (a
mixed batch writes its sync rows first, job rows at background priority, offsets done
per write), 14 (one worker shared by several schedulers: each scheduler's core keeps
its own two-in-flight bound and hands back only its own batches).
"""

from __future__ import annotations

import itertools
import math
import random

import pytest

from core.protocol import ModelInfo, WorkResult
from core.vocab import PRIORITY_CLASSES, RequestStatus
from scheduler.core.backpressure import BufferBudget
from scheduler.core.batcher import Batch, BatchKey, FlushPolicy, Pending
from scheduler.core.dispatch import DispatchCore
from scheduler.core.plans import (
    BACKGROUND_RANK,
    CANCELLED_ERROR,
    EXPIRED_ERROR,
    MAX_IN_FLIGHT,
    InFlight,
    Reject,
    Worker,
    Write,
)
from scheduler.core.retry import RetryPolicy
from tests.unit.helpers import pending

KEY = BatchKey("sim", "1")
REF = KEY.ref
SYNC = PRIORITY_CLASSES.index("paid")
JOBS = BACKGROUND_RANK
TP = ("t", 0)
_job_ids = itertools.count()


def make_core(**kw: object) -> DispatchCore:
    return DispatchCore(
        flush=FlushPolicy(max_linger_s=0.050, margin_s=0.020),
        batch_budget_ms=1000.0,
        budget=BufferBudget((100, 100, 100, 10)),
        retry=RetryPolicy(max_attempts=3),
        rng=random.Random(7),
        **kw,  # type: ignore[arg-type]
    )


def add_worker(core: DispatchCore, ms: float = 100.0, size: int = 4, wid: str = "w") -> Worker:
    return core.add_worker(wid, [ModelInfo("sim", "1", size, {1: ms, size: ms})])


def item(
    rank: int = SYNC,
    *,
    at: float = 0.0,
    deadline: float = 100.0,
    job: str | None = None,
    offset: int | None = None,
    tp: tuple[str, int] = TP,
) -> Pending:
    p = pending(key=KEY, rank=rank, at=at, deadline=deadline, offset=offset, tp=tp)
    if job is not None or rank == JOBS:
        p.msg.job_id = job or f"00000000-0000-0000-0000-{next(_job_ids):012d}"
        p.msg.priority = "jobs"
    return p


def queue(core: DispatchCore, *items: Pending) -> None:
    core.accept(list(items), [], {p.tp for p in items})


def ok(entry: InFlight, start: float = 1.0, end: float = 1.1) -> WorkResult:
    return WorkResult(
        entry.batch.batch_id, [f"out-{p.offset}" for p in entry.batch.items], None, start, end
    )


def failed(entry: InFlight, error: str = "boom") -> WorkResult:
    return WorkResult(entry.batch.batch_id, None, error, 1.0, 1.1)


def started(core: DispatchCore, w: Worker, now: float) -> InFlight:
    step = core.schedule(w, now)
    assert step.start is not None, step
    return step.start


# ---- what a free worker runs next ----------------------------------------------------------
def test_a_full_batch_starts_at_once_a_short_one_waits_out_its_linger() -> None:
    core = make_core()
    w = add_worker(core)
    queue(core, item(at=0.0))
    step = core.schedule(w, 0.01)
    assert step.start is None and step.wait_until == pytest.approx(0.05)
    assert core.schedule(w, 0.05).start is not None
    queue(core, *[item(at=1.0) for _ in range(4)])
    assert core.schedule(make_worker_free(core, w), 1.0).start is not None


def make_worker_free(core: DispatchCore, w: Worker) -> Worker:
    for entry in list(w.queue):
        core.on_result(w, entry, ok(entry), 0.0)
    return w


def test_idle_worker_waits_until_something_changes() -> None:
    core = make_core()
    w = add_worker(core)
    step = core.schedule(w, 5.0)
    assert step.start is None and not step.stop and step.wait_until == math.inf


def test_expired_requests_are_recorded_never_run_and_offsets_wait_for_their_rows() -> None:
    core = make_core()
    w = add_worker(core)
    late, fine = item(at=0.0, deadline=0.05, offset=0), item(at=0.0, offset=1)
    queue(core, late, fine)
    step = core.schedule(w, 0.06)  # 0.05 < 0.06 + 0.1 compute: it cannot make it
    assert [(x.status, x.error, x.items) for x in step.writes] == [
        ("expired", EXPIRED_ERROR, [late])
    ]
    assert step.start is not None and step.start.batch.items == [fine]
    assert core.committable({TP}) == {TP: 0}, "nothing is committable before a row exists"
    core.done([(late.tp, late.offset)], 1)
    assert core.committable({TP}) == {TP: 1}


def test_cancelled_job_items_are_recorded_the_rest_of_the_batch_runs() -> None:
    core = make_core()
    w = add_worker(core)
    job = "00000000-0000-0000-0000-00000000cafe"
    gone = [item(JOBS, job=job) for _ in range(2)]
    keep = item(JOBS)
    queue(core, *gone, keep)
    core.set_cancelled(frozenset({(job, 0)}))
    step = core.schedule(w, 1.0)
    assert [(x.status, x.error) for x in step.writes] == [("cancelled", CANCELLED_ERROR)]
    assert step.writes[0].items == gone
    assert step.start is not None and step.start.batch.items == [keep]


def test_a_batch_of_cancelled_items_only_starts_nothing() -> None:
    core = make_core()
    w = add_worker(core)
    job = "00000000-0000-0000-0000-00000000beef"
    queue(core, item(JOBS, job=job))
    core.set_cancelled(frozenset({(job, 0)}))
    step = core.schedule(w, 1.0)
    assert step.start is None and len(step.writes) == 1


def test_a_retry_starts_when_its_time_has_come() -> None:
    core = make_core()
    w = add_worker(core)
    p = item()
    queue(core, p)
    entry = started(core, w, 1.0)
    writes = core.on_result(w, entry, failed(entry), 1.2)
    assert writes == []  # a lone input: retried, not failed yet
    assert p.msg.attempt == 1
    (retry,) = core.retries
    step = core.schedule(w, 1.2)
    if retry.not_before > 1.2:
        assert step.start is None and step.wait_until == retry.not_before
        step = core.schedule(w, retry.not_before)
    assert step.start is not None and step.start.batch.items == [p]
    assert step.start.batch.reason == "retry"


def test_a_failed_batch_is_split_and_a_lone_input_fails_after_its_attempts() -> None:
    core = make_core()
    w = add_worker(core)
    items = [item() for _ in range(4)]
    queue(core, *items)
    entry = started(core, w, 0.0)
    assert core.on_result(w, entry, failed(entry), 0.2) == []
    assert [r.batch.items for r in core.retries] == [items[:2], items[2:]]
    assert all(r.not_before == 0.2 for r in core.retries)  # a split retries at once
    # Drive one input through its attempts alone.
    core.retries.clear()
    p = items[0]
    now, writes = 1.0, []
    for _ in range(3):
        entry = InFlight(Batch(KEY, [p], now, "retry"), 0.1)
        w.queue.append(entry)
        writes = core.on_result(w, entry, failed(entry, "bad input"), now)
        now += 10
    assert p.msg.attempt == 3
    (write,) = writes
    assert write.status == "failed" and write.items == [p] and write.dead_letter
    assert write.error == "bad input (gave up after 3 attempts)"


def test_dispatch_stops_when_asked_and_for_a_dead_worker() -> None:
    core = make_core()
    w, v = add_worker(core), add_worker(core, wid="v")
    queue(core, *[item() for _ in range(4)])
    core.retire(v)
    assert core.schedule(v, 0.0).stop
    core.stop_dispatching()
    assert core.schedule(w, 0.0).stop
    assert not core.idle()


# ---- decision 11: sync before job items, job batches staggered --------------------------------
def test_a_free_worker_flushes_a_lingering_sync_queue_before_a_ready_job_batch() -> None:
    core = make_core()
    w = add_worker(core)
    sync_key = BatchKey("sim", "1", (("salt", "s"),))
    s = pending(key=sync_key, rank=SYNC, at=1.0)
    queue(core, *[item(JOBS, at=0.0) for _ in range(4)], s)
    entry = started(core, w, 1.01)  # the job batch is full; the sync one lingers until 1.05
    assert entry.batch.items == [s] and entry.batch.reason == "priority"


def test_job_batches_start_staggered_across_workers() -> None:
    core = make_core()
    a, b = add_worker(core, wid="a"), add_worker(core, wid="b")
    queue(core, *[item(JOBS) for _ in range(8)])
    first = started(core, a, 1.0)
    assert first.batch.items[0].rank == JOBS
    # b is free at once, but a job batch of 100 ms on two workers starts 50 ms apart.
    step = core.schedule(b, 1.01)
    assert step.start is None and step.wait_until == pytest.approx(1.05)
    assert core.schedule(b, 1.05).start is not None


def test_a_sync_backlog_is_held_to_the_stagger_point_once_unless_its_deadline_says_go() -> None:
    # Saturated workers that start together stay together; held once, their starts are
    # spread for good (decision 24). A request that cannot wait goes at once.
    core = make_core()
    a, b = add_worker(core, wid="a"), add_worker(core, wid="b")
    queue(core, *[item(JOBS) for _ in range(4)])
    started(core, a, 1.0)
    queue(core, *[item(SYNC, at=1.01) for _ in range(4)], *[item(JOBS) for _ in range(4)])
    step = core.schedule(b, 1.01)
    assert step.start is None and step.wait_until == pytest.approx(1.05)  # 100 ms / 2
    entry = started(core, b, 1.05)
    assert all(p.rank == SYNC for p in entry.batch.items)
    queue(core, *[item(SYNC, at=1.06, deadline=1.2) for _ in range(4)])
    c = add_worker(core, wid="c")
    assert all(p.rank == SYNC for p in started(core, c, 1.06).batch.items)


def test_the_stagger_follows_the_batch_a_worker_computes() -> None:
    core = make_core(max_in_flight=2)
    a, b = add_worker(core, wid="a"), add_worker(core, wid="b")
    queue(core, *[item(JOBS) for _ in range(8)])
    entry = started(core, a, 1.0)
    core.on_result(a, entry, ok(entry), 1.1)
    assert a.running is None  # nothing computing: no hold for b
    assert core.schedule(b, 1.1).start is not None


# ---- decision 12: a second batch on a busy worker only when batches are short --------------
def test_short_batches_queue_one_more_never_two() -> None:
    core = make_core()
    w = add_worker(core, ms=5.0)
    assert core.may_queue(w)
    queue(core, *[item() for _ in range(12)])
    first, second = started(core, w, 0.0), started(core, w, 0.0)
    assert list(w.queue) == [first, second] and MAX_IN_FLIGHT == 2
    busy = core.schedule(w, 0.0)
    assert busy.start is None and busy.wait_until == math.inf
    # The first comes back: the queued one computes from now, and there is room again.
    core.on_result(w, first, ok(first), 0.005)
    assert w.running is not None and w.running.started_at == 0.005
    assert core.schedule(w, 0.005).start is not None


def test_a_sync_batch_joins_a_worker_whose_slots_hold_job_batches_only() -> None:
    """Decision 76: a worker shared by several schedulers launches it before their job
    batches, so it need not wait for one of this scheduler's job batches to finish."""
    core = make_core()
    w = add_worker(core, ms=5.0)
    queue(core, *[item(JOBS) for _ in range(8)])
    first, second = started(core, w, 0.0), started(core, w, 0.0)
    assert first.background and second.background
    queue(core, item(at=0.0), item(at=0.0))
    lingering = core.schedule(w, 0.001)  # two sync items lingering: woken when they flush
    assert lingering.start is None and 0.001 < lingering.wait_until < math.inf
    third = started(core, w, lingering.wait_until)
    assert not third.background and [p.rank for p in third.batch.items] == [SYNC, SYNC]
    assert list(w.queue) == [first, second, third]
    queue(core, *[item(at=0.1) for _ in range(4)])  # a full sync batch: one extra only
    assert core.schedule(w, 0.1).start is None
    # Once a job batch is back, the slots are no longer all job batches': as before.
    core.on_result(w, first, ok(first), 0.2)
    assert core.schedule(w, 0.2).start is None
    core.on_result(w, second, ok(second), 0.3)
    assert started(core, w, 0.3).batch.items[0].rank == SYNC


def test_a_job_batch_never_takes_an_extra_slot() -> None:
    core = make_core()
    w = add_worker(core, ms=5.0)
    queue(core, *[item(JOBS) for _ in range(12)])
    started(core, w, 0.0), started(core, w, 0.0)
    assert core.schedule(w, 0.0).start is None


def test_long_job_batches_run_one_at_a_time_sync_too() -> None:
    core = make_core()
    w = add_worker(core, ms=100.0)
    queue(core, *[item(JOBS) for _ in range(8)])
    started(core, w, 0.0)
    queue(core, *[item() for _ in range(4)])
    assert core.schedule(w, 0.0).start is None  # no second batch may wait: no extra either


def test_long_batches_run_one_at_a_time() -> None:
    core = make_core()
    w = add_worker(core, ms=100.0)
    assert not core.may_queue(w)
    queue(core, *[item() for _ in range(12)])
    started(core, w, 0.0)
    assert core.schedule(w, 0.0).start is None


def test_a_lost_worker_hands_back_all_it_held_only_the_computing_batch_is_blamed() -> None:
    core = make_core()
    w = add_worker(core, ms=5.0, wid="w")
    other = add_worker(core, ms=5.0, wid="other")
    queue(core, *[item() for _ in range(8)])
    computing, queued = started(core, w, 0.0), started(core, w, 0.0)
    lost = core.on_lost(w, "the worker process crashed", ran=True, now=0.01)
    assert lost.held == [computing.batch, queued.batch]
    assert w not in core.workers and not w.alive
    # The computing batch is split (one attempt spent on the split, none on items);
    # the queued one goes back unchanged and another worker takes it at once.
    batches = [r.batch for r in core.retries]
    assert queued.batch in batches
    assert all(p.msg.attempt == 0 for p in queued.batch.items)
    assert sum(len(b.items) for b in batches) == 8
    taken = [started(core, other, 0.01).batch for _ in range(2)]
    assert taken[0] is queued.batch  # back first, as it was
    assert taken[1].reason == "retry" and taken[1].items == computing.batch.items[:2]


def test_a_batch_that_never_reached_the_worker_goes_back_unblamed() -> None:
    core = make_core()
    w = add_worker(core)
    p = item()
    queue(core, p)
    entry = started(core, w, 1.0)
    core.send_failed(w, entry, 1.1)
    assert [r.batch for r in core.retries] == [entry.batch] and p.msg.attempt == 0
    assert not w.alive and core.schedule(w, 1.1).stop
    # The receiver, finding the worker lost afterwards, hands back nothing twice.
    lost = core.on_lost(w, "gone", ran=True, now=1.2)
    assert lost.held == [] and lost.writes == [] and len(core.retries) == 1


# ---- decision 13: a mixed batch writes its sync rows first ------------------------------------
def test_a_mixed_batch_writes_sync_rows_first_with_the_batch_row_then_job_rows() -> None:
    core = make_core()
    w = add_worker(core)
    jobs = [item(JOBS, offset=o) for o in (0, 1)]
    syncs = [item(SYNC, offset=o) for o in (2, 3)]
    queue(core, *jobs, *syncs)
    entry = started(core, w, 1.0)
    assert [p.rank for p in entry.batch.items] == [SYNC, SYNC, JOBS, JOBS]
    (first,) = core.on_result(w, entry, ok(entry), 1.2)
    assert first.items == syncs and first.batch_row and first.priority == SYNC
    assert first.outputs == ["out-2", "out-3"]
    then = first.then
    assert then is not None and then.items == jobs and not then.batch_row
    assert then.priority == BACKGROUND_RANK and then.outputs == ["out-0", "out-1"]
    # Each offset is done only with its own write: the sync rows alone move nothing
    # past the job items' offsets.
    core.done([(p.tp, p.offset) for p in first.items], 2)
    assert core.committable({TP}) == {TP: 0}
    core.done([(p.tp, p.offset) for p in then.items], 2)
    assert core.committable({TP}) == {TP: 4}


def test_a_batch_of_one_kind_is_one_write() -> None:
    core = make_core()
    w = add_worker(core)
    queue(core, *[item(JOBS) for _ in range(4)])
    entry = started(core, w, 1.0)
    (write,) = core.on_result(w, entry, ok(entry, 1.0, 1.05), 1.2)
    assert write.then is None and write.batch_row and write.priority == JOBS
    assert write.compute == (1.0, 1.05) and write.worker_id == "w"
    assert core.cost.predict_ms(REF, 4) == pytest.approx(50.0)  # measured: the warm-up gives way


# ---- decision 14: one worker serving several schedulers -----------------------------------------
def test_each_scheduler_bounds_its_own_batches_on_a_shared_worker_and_hands_back_its_own() -> None:
    a, b = make_core(), make_core()
    wa, wb = add_worker(a, ms=5.0, wid="gpu0"), add_worker(b, ms=5.0, wid="gpu0")
    queue(a, *[item() for _ in range(12)])
    queue(b, *[item() for _ in range(12)])
    mine = [started(a, wa, 0.0), started(a, wa, 0.0)]
    theirs = [started(b, wb, 0.0), started(b, wb, 0.0)]
    assert a.schedule(wa, 0.0).start is None and b.schedule(wb, 0.0).start is None
    # The worker hangs; scheduler a sees it first and kills it; b finds it lost next.
    lost_a = a.on_lost(wa, "the worker hung", ran=True, now=1.0)
    assert lost_a.held == [e.batch for e in mine]
    assert b.workers == [wb] and list(wb.queue) == theirs  # b's view is its own
    lost_b = b.on_lost(wb, "the worker process crashed", ran=True, now=1.0)
    assert lost_b.held == [e.batch for e in theirs]
    ids_a = {p.msg.request_id for r in a.retries for p in r.batch.items}
    ids_b = {p.msg.request_id for r in b.retries for p in r.batch.items}
    assert len(ids_a) == len(ids_b) == 8 and not ids_a & ids_b


# ---- fetches, revocations, backpressure, views ---------------------------------------------------
def test_only_owned_partitions_are_queued_and_rejects_hold_their_offset() -> None:
    core = make_core()
    mine, gone = item(tp=TP, offset=0), item(tp=("t", 1), offset=0)
    bad = Reject(TP, 1, b"\xff", "not JSON")
    kept = core.accept([mine, gone], [bad, Reject(("t", 1), 5, b"", "x")], {TP})
    assert kept == [bad] and len(core.batcher) == 1
    core.done([(mine.tp, mine.offset)], 1)
    assert core.committable({TP, ("t", 1)}) == {TP: 1}
    core.done([(bad.tp, bad.offset)])
    assert core.committable({TP}) == {TP: 2}


def test_revoked_partitions_drop_queued_and_retrying_work_and_late_rows_are_ignored() -> None:
    core = make_core()
    w = add_worker(core)
    other = ("t", 1)
    a, b = item(tp=TP, offset=0), item(tp=other, offset=0)
    queue(core, a, b)
    entry = started(core, w, 1.0)
    core.on_result(w, entry, failed(entry), 1.1)  # split: both retrying
    queue(core, item(tp=other, offset=1))
    core.revoke([other])
    assert [p for r in core.retries for p in r.batch.items] == [a]
    assert len(core.batcher) == 0
    core.done([(other, 0)], 1)  # a late row of the old owner: harmless
    assert other not in core.committable({TP, other})


def test_backpressure_pauses_a_full_class_and_resumes_at_half() -> None:
    core = make_core()
    queue(core, *[item(JOBS) for _ in range(10)])
    assert core.paused(frozenset()) == {JOBS}
    w = add_worker(core, size=8)
    started(core, w, 1.0)
    assert core.paused(frozenset({JOBS})) == frozenset()


def test_load_view_reports_capacity_of_live_workers_and_backlog_by_class() -> None:
    core = make_core()
    w = add_worker(core, ms=100.0, size=4)
    queue(core, item(SYNC), item(JOBS))
    view = core.load({"jobs": 7})
    assert view.capacity["sim@1"]["items_s"] == pytest.approx(40.0)
    assert view.capacity["sim@1"]["batch"] == 4 and view.capacity["sim@1"]["workers"] == 1
    assert view.backlog == {"sim@1": {"enterprise": 0, "paid": 1, "free": 0, "jobs": 1}}
    assert view.lag == {"jobs": 7} and set(view.tenants["sim@1"]) == {"paid", "jobs"}
    assert core.live_models() == {REF: (4, {1: 100.0, 4: 100.0})}
    core.retire(w)
    assert core.load({}).capacity == {} and core.live_models() == {}


def test_writes_are_plain_data() -> None:
    w = Write(priority=1, status=RequestStatus.EXPIRED, items=[])
    assert w.then is None and not w.dead_letter
