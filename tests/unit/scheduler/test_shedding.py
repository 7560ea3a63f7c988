"""Shedding admitted sync requests early (scheduler/core/shedding.py, decision 62): a
request the queue ahead and the arrivals above it say will start too late is dropped as
soon as that shows, with a Retry-After; one that can make it is kept; job items never.
Pure, on a fake clock."""

from __future__ import annotations

import math

import pytest

from core.messages import KEEP_UNTIL
from core.protocol import ModelInfo
from core.shed import shed_error, shed_retry_after_s
from core.vocab import PRIORITY_CLASSES, RequestStatus
from scheduler.core.batcher import Batcher, BatchKey, FlushPolicy, Pending
from scheduler.core.costmodel import CostModel
from scheduler.core.shedding import (
    LOW_Z,
    NO_CAPACITY_RETRY_S,
    SHED_PERIOD_S,
    Arrivals,
    left_rate,
    retry_after_s,
    start_in_s,
)
from tests.unit.helpers import pending
from tests.unit.scheduler.test_dispatch_core import make_core, queue

KEY = BatchKey("sim", "1")
REF = KEY.ref
ENT, PAID, FREE, JOBS = (PRIORITY_CLASSES.index(c) for c in ("enterprise", "paid", "free", "jobs"))
MARGIN = 0.02


def make_batcher(max_batch: int = 10, batch_ms: float = 100.0) -> Batcher:
    return Batcher(
        policy=FlushPolicy(max_linger_s=0.05, margin_s=MARGIN),
        cost=CostModel(default_ms=batch_ms),
        max_batch=lambda ref: max_batch,
    )


def item(rank: int, at: float, deadline: float, tenant: str = "t1") -> Pending:
    p = pending(key=KEY, rank=rank, at=at, deadline=deadline)
    p.msg.tenant_id = tenant
    return p


def arrive(b: Batcher, rank: int, rate: float, start: float, until: float) -> None:
    """Count ``rate``/s of ``rank`` as arrived over [start, until) without queueing them
    (they were served as they came)."""
    n = int(rate * (until - start))
    for i in range(n):
        b.arrivals.add((REF, rank), start + i / rate)


# ---- the pure parts ----------------------------------------------------------------------
def test_arrival_rates_are_counted_over_the_whole_window() -> None:
    a = Arrivals(window_s=5.0, bucket_s=0.25)
    for i in range(100):
        a.add("k", 10.0 + i * 0.01)  # 100 in one second: a burst, not 100/s to expect
    assert a.rate("k", 11.0) == pytest.approx(20.0)
    assert a.rate("k", 15.0) == pytest.approx(20.0)
    assert a.rate("k", 17.0) == 0.0  # all of it left the window
    assert a.rate("other", 17.0) == 0.0


@pytest.mark.parametrize(
    ("items_s", "above_s", "span_s"),
    [(200, 0, 5), (200, 150, 5), (200, 199, 5), (200, 260, 5), (2000, 1900, 5), (20, 5, 1)],
)
def test_the_rate_left_to_a_class_takes_the_arrivals_above_at_their_low_end(
    items_s: float, above_s: float, span_s: float
) -> None:
    left = left_rate(items_s, above_s, span_s)
    low = above_s - LOW_Z * math.sqrt(above_s / span_s)
    assert left == pytest.approx(max(0.0, items_s - max(0.0, low)))
    assert left >= max(0.0, items_s - above_s)  # never less than the plain difference


@pytest.mark.parametrize(
    ("ahead", "before", "items_s", "left", "expected"),
    [
        (0, 0, 200, 0, 0.0),  # nothing ahead: it rides in the next batch
        (100, 0, 200, 50, 0.5),  # the classes above first, at the full rate
        (100, 10, 200, 50, 0.7),  # then its own class's, at what they leave
        (0, 10, 200, 0, math.inf),  # nothing left to its class: never
        (5, 0, 0, 10, math.inf),  # no workers
    ],
)
def test_when_a_queued_request_starts(
    ahead: int, before: int, items_s: float, left: float, expected: float
) -> None:
    assert start_in_s(ahead, before, items_s, left) == pytest.approx(expected)


def test_retry_after_is_the_wait_beyond_the_deadline_at_least_a_second() -> None:
    assert retry_after_s(7.0, 4.5) == pytest.approx(2.5)
    assert retry_after_s(4.6, 4.5) == 1.0
    assert retry_after_s(3.0, -1.0) == 3.0  # a budget already gone counts as none
    assert retry_after_s(math.inf, 4.0) == NO_CAPACITY_RETRY_S


@pytest.mark.parametrize("retry", [0.2, 1.0, 2.5, 30.0])
def test_the_shed_error_carries_its_retry_after_and_no_other_error_does(retry: float) -> None:
    assert shed_retry_after_s(shed_error(retry)) == max(1, math.ceil(retry))
    assert shed_retry_after_s("deadline passed before a worker could run it") is None
    assert shed_retry_after_s(None) is None


# ---- the batcher: what is shed, what is kept ---------------------------------------------
@pytest.mark.parametrize(
    ("batch_ms", "max_batch"), [(10, 1), (20, 2), (100, 10), (300, 30), (500, 50)]
)
def test_a_lower_class_left_nothing_by_the_classes_above_is_shed_with_its_time_left(
    batch_ms: float, max_batch: int
) -> None:
    """Paid arrives beyond the workers' whole rate: a free request queued behind another
    would never start, so it is shed now, with nearly all of its 5 s left, not at its
    deadline. The head, with nothing queued ahead of it, may ride in the next batch."""
    b = make_batcher(max_batch, batch_ms)
    items_s = 2 * max_batch / (batch_ms / 1000)
    arrive(b, PAID, items_s * 1.2, 0.0, 5.0)
    free = [item(FREE, 4.9 + i * 1e-4, 9.9) for i in range(5)]
    for p in free:
        b.add(p)
    shed = b.drop_hopeless(5.0, {REF: items_s}, {REF: batch_ms / 1000})
    assert [p for p, _ in shed] == free[1:]
    assert all(r == NO_CAPACITY_RETRY_S for _, r in shed)
    assert len(b) == 1


@pytest.mark.parametrize(
    ("batch_ms", "max_batch"), [(10, 1), (20, 2), (100, 10), (300, 30), (500, 50)]
)
def test_a_queue_the_workers_drain_in_time_is_kept(batch_ms: float, max_batch: int) -> None:
    """Paid takes 60% of the workers: free's queue of 2 s of what is left is kept."""
    b = make_batcher(max_batch, batch_ms)
    items_s = 2 * max_batch / (batch_ms / 1000)
    arrive(b, PAID, items_s * 0.6, 0.0, 5.0)
    n = int(items_s * 0.4 * 2)
    for _ in range(n):
        b.add(item(FREE, 4.9, 9.9))
    assert b.drop_hopeless(5.0, {REF: items_s}, {REF: batch_ms / 1000}) == []
    assert len(b) == n


def test_the_tail_of_a_class_queue_is_shed_and_its_head_kept() -> None:
    """200/s, paid arrives at 150/s: free drains at about 50/s, so of 400 free requests
    with 4.9 s left the first ~240 start in time and the rest are shed, each with a
    Retry-After of the wait beyond its deadline."""
    b = make_batcher()
    arrive(b, PAID, 150, 0.0, 5.0)
    free = [item(FREE, 5.0 + i * 1e-4, 9.9) for i in range(400)]
    for p in free:
        b.add(p)
    shed = b.drop_hopeless(5.0, {REF: 200.0}, {REF: 0.1})
    dropped = {id(p) for p, _ in shed}
    kept = [i for i, p in enumerate(free) if id(p) not in dropped]
    assert kept == list(range(len(kept)))  # the head, in order
    left = left_rate(200.0, 150.0, 5.0)
    assert len(kept) == pytest.approx((4.9 - 0.1 - MARGIN) * left, abs=2)
    retries = [r for _, r in shed]
    assert retries == sorted(retries) and retries[0] >= 1.0


def test_requests_of_the_classes_above_queued_now_run_first() -> None:
    """Nothing arrives above free, but 900 enterprise requests wait: at 200/s they take
    4.5 s, and a free request with 4 s left is shed while one with 9 s is kept."""
    b = make_batcher()
    for _ in range(900):
        b.add(item(ENT, 5.0, 6.0))
    short, long_ = item(FREE, 5.0, 9.0), item(FREE, 5.0, 14.0)
    b.add(short)
    b.add(long_)
    shed = b.drop_hopeless(5.0, {REF: 200.0}, {REF: 0.1})
    assert [p for p, _ in shed if p.rank == FREE] == [short], [(p.rank, r) for p, r in shed][-3:]
    # and the enterprise tail that cannot start within its own 1 s goes too
    assert sum(p.rank == ENT for p, _ in shed) == pytest.approx(900 - 200 * (1 - 0.12), abs=2)


def test_a_request_kept_for_a_partial_answer_is_not_shed() -> None:
    """Its caller takes what is done at the deadline and the rest later (decision 63):
    it runs on to its keep_until, where drop_expired ends it."""
    b = make_batcher()
    arrive(b, PAID, 1000, 0.0, 5.0)
    head, kept, tail = (item(FREE, 5.0 + i * 1e-4, 6.0) for i in range(3))
    kept.msg.extra[KEEP_UNTIL] = 300.0
    for p in (head, kept, tail):
        b.add(p)
    # The head may ride in the next batch; of the two behind it only the plain one goes.
    assert [p for p, _ in b.drop_hopeless(5.0, {REF: 200.0}, {REF: 0.1})] == [tail]
    assert len(b) == 2


def test_job_items_are_never_shed() -> None:
    b = make_batcher()
    arrive(b, PAID, 1000, 0.0, 5.0)
    b.add(item(JOBS, 5.0, 6.0))
    assert b.drop_hopeless(5.0, {REF: 200.0}, {REF: 0.1}) == []


def test_inside_a_class_only_the_tenants_own_queue_counts_ahead() -> None:
    """A noisy tenant's 1,000 free requests do not make a quiet tenant's one late: round
    robin serves it within a turn. The noisy tail is shed."""
    b = make_batcher()
    arrive(b, PAID, 150, 0.0, 5.0)
    for i in range(1000):
        b.add(item(FREE, 5.0 + i * 1e-5, 9.9, tenant="noisy"))
    quiet = item(FREE, 5.0, 9.9, tenant="quiet")
    b.add(quiet)
    shed = b.drop_hopeless(5.0, {REF: 200.0}, {REF: 0.1})
    assert shed and all(p.tenant == "noisy" for p, _ in shed)


# ---- the dispatch core: when it checks, what it writes ----------------------------------
def test_the_core_writes_shed_requests_as_expired_with_their_retry_after() -> None:
    core = make_core()
    w = core.add_worker("w", [ModelInfo("sim", "1", 4, {1: 100.0, 4: 100.0})])
    # 4 per 100 ms = 40/s; enterprise has been arriving at 60/s: nothing left for paid.
    for i in range(300):
        core.batcher.arrivals.add((REF, ENT), i / 60)
    head, *doomed = [item(PAID, 5.0 + i * 1e-3, 9.0) for i in range(3)]
    queue(core, head, *doomed)
    step = core.schedule(w, 5.0)
    shed = [wr for wr in step.writes if wr.status == RequestStatus.EXPIRED]
    assert [p.msg.request_id for wr in shed for p in wr.items] == [p.msg.request_id for p in doomed]
    assert shed[0].error == shed_error(NO_CAPACITY_RETRY_S)
    assert core.stats["shed"] == 2
    # Checked at most every SHED_PERIOD_S: a request queued just after waits for it.
    late = item(PAID, 5.0, 9.0)
    queue(core, late)
    assert not any(wr.error for wr in core.schedule(w, 5.0 + SHED_PERIOD_S / 2).writes)
