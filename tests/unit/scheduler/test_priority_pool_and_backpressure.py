"""The persist pool serves urgent work first; backpressure pauses full classes only."""

from __future__ import annotations

import threading

import pytest

from scheduler.core.backpressure import (
    HOLD_MAX_S,
    BufferBudget,
    LaneHold,
    lane_hold,
    paused_classes,
)
from scheduler.runtime.priority_pool import PriorityPool


def test_urgent_tasks_overtake_a_backlog() -> None:
    gate = threading.Event()
    order: list[str] = []
    pool = PriorityPool(1, name="t")
    pool.submit(0, gate.wait)  # hold the only thread while the queue fills
    for i in range(5):
        pool.submit(3, order.append, f"job{i}")
    pool.submit(0, order.append, "sync")
    gate.set()
    pool.shutdown(wait=True)
    assert order[0] == "sync" and order[1:] == [f"job{i}" for i in range(5)]


def test_pool_survives_a_failing_task() -> None:
    done: list[int] = []
    pool = PriorityPool(1, name="t")
    pool.submit(1, lambda: 1 / 0)
    pool.submit(1, done.append, 1)
    pool.shutdown(wait=True)
    assert done == [1]


def test_jobs_class_has_the_smaller_budget() -> None:
    b = BufferBudget.default(1000, 4)
    assert b.per_class == (1000, 1000, 1000, 250)


def test_pause_with_hysteresis() -> None:
    b = BufferBudget((10, 10, 10, 4))
    p = paused_classes([0, 0, 0, 4], frozenset(), b)
    assert p == {3}
    assert paused_classes([0, 0, 0, 3], p, b) == {3}  # not yet drained to half
    assert paused_classes([0, 0, 0, 1], p, b) == frozenset()
    assert paused_classes([10, 0, 0, 0], frozenset(), b) == {0}


def test_sync_classes_keep_flowing_while_jobs_are_paused() -> None:
    b = BufferBudget.default(100, 4)
    assert paused_classes([5, 5, 5, 25], frozenset(), b) == {3}


def test_reserved_thread_runs_urgent_work_while_background_holds_the_others() -> None:
    gate, ran, taken = threading.Event(), threading.Event(), threading.Event()
    pool = PriorityPool(2, name="t", reserved=1, background_from=3)

    def long_write() -> None:
        taken.set()
        gate.wait()

    pool.submit(3, long_write)  # a long job write takes the only general thread
    assert taken.wait(2)  # (counting before it is taken would count it as pending)
    for _ in range(5):
        pool.submit(3, lambda: None)
    pool.submit(0, ran.set)
    assert ran.wait(2), "the sync write waited behind job writes"
    assert pool.pending() == 5, "the reserved thread never takes background work"
    gate.set()
    pool.shutdown(wait=True)
    assert pool.pending() == 0


def test_pool_needs_a_thread_for_background_work() -> None:
    with pytest.raises(ValueError):
        PriorityPool(1, name="t", reserved=1)


JOBS_LANE = frozenset({3})
SYNC_LANE = frozenset({0, 1, 2})


def test_a_lane_over_budget_holds_before_it_pauses() -> None:
    """Holding keeps librdkafka's prefetch (a pause would drop it); only a hold that
    lasts HOLD_MAX_S turns into a pause, so rebalances are served again."""
    h = lane_hold(JOBS_LANE, JOBS_LANE, LaneHold(), now=100.0)
    assert h == LaneHold(paused=frozenset(), held_since=100.0)
    h = lane_hold(JOBS_LANE, JOBS_LANE, h, now=100.0 + HOLD_MAX_S / 2)
    assert h.held_since == 100.0 and not h.paused  # still held, since the first moment
    h = lane_hold(JOBS_LANE, JOBS_LANE, h, now=100.0 + HOLD_MAX_S)
    assert h == LaneHold(paused=JOBS_LANE)  # paused, and polling again
    assert lane_hold(JOBS_LANE, JOBS_LANE, h, now=200.0) == h  # stays paused
    assert lane_hold(frozenset(), JOBS_LANE, h, now=201.0) == LaneHold()  # drained: resumed


def test_a_hold_that_drains_in_time_never_pauses() -> None:
    h = lane_hold(JOBS_LANE, JOBS_LANE, LaneHold(), now=0.0)
    assert lane_hold(frozenset(), JOBS_LANE, h, now=0.2) == LaneHold()
    # A new hold starts its own clock.
    assert lane_hold(JOBS_LANE, JOBS_LANE, LaneHold(), now=5.0).held_since == 5.0


def test_some_classes_over_budget_are_paused_so_the_others_flow() -> None:
    h = lane_hold(frozenset({2}), SYNC_LANE, LaneHold(), now=0.0)
    assert h == LaneHold(paused=frozenset({2}))
    # Then every class is over: held (the paused one stays paused), then all paused.
    h = lane_hold(SYNC_LANE, SYNC_LANE, h, now=1.0)
    assert h.paused == {2} and h.held_since == 1.0
    h = lane_hold(SYNC_LANE, SYNC_LANE, h, now=1.0 + HOLD_MAX_S)
    assert h == LaneHold(paused=SYNC_LANE)
    # Classes of other lanes in ``wanted`` are not this lane's business.
    assert lane_hold(frozenset({1, 3}), SYNC_LANE, LaneHold(), now=0.0).paused == {1}
