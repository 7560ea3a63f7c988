"""The worker's queue of received batches: the most urgent scheduler's next first, each
scheduler's batches in the order it sent them (workers/ready.py, decision 76)."""

from __future__ import annotations

import math
import random
import threading

from hypothesis import given
from hypothesis import strategies as st

from workers.ready import ReadyQueue, Waiting, pick

JOB = 1e12  # a job's completion window: far off
SYNC = 100.0


def test_a_sync_batch_goes_before_other_schedulers_job_batches() -> None:
    q: ReadyQueue[str] = ReadyQueue()
    for i in range(4):
        q.put(f"s{i}", f"job-{i}", JOB)
    q.put("s4", "sync", SYNC)
    assert q.get(0) == ("s4", "sync")
    assert [q.get(0) for _ in range(4)] == [(f"s{i}", f"job-{i}") for i in range(4)]
    assert q.get(0) is None


def test_a_scheduler_s_own_job_batch_goes_first_on_behalf_of_its_sync_batch() -> None:
    q: ReadyQueue[str] = ReadyQueue()
    q.put("a", "job-a", JOB)
    q.put("b", "job-b1", JOB)
    q.put("b", "sync-b", SYNC)  # behind b's own job batch: b's results come back in order
    assert [q.get(0) for _ in range(3)] == [("b", "job-b1"), ("b", "sync-b"), ("a", "job-a")]


def test_equal_deadlines_and_none_keep_arrival_order() -> None:
    q: ReadyQueue[str] = ReadyQueue()
    q.put("a", 1, None)
    q.put("b", 2, None)
    q.put("a", 3, None)
    q.put("c", 4, 5.0)  # a deadline beats none
    assert [q.get(0) for _ in range(4)] == [("c", 4), ("a", 1), ("b", 2), ("a", 3)]


def test_a_gone_scheduler_is_seen_before_any_deadline() -> None:
    q: ReadyQueue[str] = ReadyQueue()
    q.put("a", "sync", SYNC)
    q.put("b", None, -math.inf)
    assert q.get(0) == ("b", None)


def test_get_waits_for_a_put_and_times_out_empty() -> None:
    q: ReadyQueue[str] = ReadyQueue()
    assert q.get(0.01) is None
    threading.Timer(0.05, lambda: q.put("a", "x", 1.0)).start()
    assert q.get(5.0) == ("a", "x")
    assert len(q) == 0


@given(st.lists(st.tuples(st.integers(0, 4), st.floats(0, 100) | st.none()), max_size=40))
def test_every_batch_comes_out_once_and_each_scheduler_s_in_order(
    sent: list[tuple[int, float | None]],
) -> None:
    q: ReadyQueue[int] = ReadyQueue()
    for n, (key, deadline) in enumerate(sent):
        q.put(key, n, deadline)
    out = [q.get(0) for _ in sent]
    assert q.get(0) is None
    assert sorted(item for _, item in out) == list(range(len(sent)))  # type: ignore[misc]
    for key in {k for k, _ in sent}:
        mine = [item for k, item in out if k == key]  # type: ignore[misc]
        assert mine == sorted(mine)


def test_pick_prefers_the_queue_holding_the_earliest_deadline() -> None:
    rnd = random.Random(7)
    for _ in range(200):
        queues = {
            k: [Waiting(rnd.randrange(1000), rnd.uniform(0, 10), None) for _ in range(3)]
            for k in range(4)
        }
        chosen = pick(queues)
        assert chosen is not None
        best = min(min(w.deadline for w in q) for q in queues.values())
        assert min(w.deadline for w in queues[chosen]) == best
    assert pick({0: []}) is None
