"""The flush rule and the batcher's choices, without any I/O."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.messages import KEEP_UNTIL
from scheduler.core.batcher import Batcher, BatchKey, FlushPolicy, flush_time
from scheduler.core.costmodel import CostModel
from tests.unit.helpers import pending

POLICY = FlushPolicy(max_linger_s=0.050, margin_s=0.020)
ALL = lambda ref: True  # noqa: E731


def make_batcher(max_batch: int = 4, compute_ms: float = 100.0) -> Batcher:
    cost = CostModel(default_ms=compute_ms)
    return Batcher(policy=POLICY, cost=cost, max_batch=lambda ref: max_batch)


def test_full_queue_flushes_now() -> None:
    assert (
        flush_time(
            oldest_at=10.0,
            earliest_deadline=99.0,
            count=8,
            max_batch=8,
            predicted_s=0.1,
            policy=POLICY,
        )
        == -math.inf
    )


def test_linger_caps_the_wait() -> None:
    at = flush_time(
        oldest_at=10.0, earliest_deadline=99.0, count=1, max_batch=8, predicted_s=0.1, policy=POLICY
    )
    assert at == pytest.approx(10.05)


def test_deadline_forces_an_earlier_flush() -> None:
    # deadline 10.2 - compute 0.1 - margin 0.02 = 10.08 < linger end? no: linger ends 10.05.
    assert flush_time(
        oldest_at=10.0,
        earliest_deadline=10.15,
        count=1,
        max_batch=8,
        predicted_s=0.1,
        policy=POLICY,
    ) == pytest.approx(10.03)


def test_lone_request_waits_for_linger_then_goes() -> None:
    b = make_batcher()
    b.add(pending(at=0.0))
    assert b.take(0.01, ALL) is None
    assert b.wake_at(ALL) == pytest.approx(0.05)
    batch = b.take(0.05, ALL)
    assert batch is not None and len(batch.items) == 1 and batch.reason == "linger"
    assert len(b) == 0


def test_full_batch_goes_without_waiting_and_caps_size() -> None:
    b = make_batcher(max_batch=4)
    for _ in range(10):
        b.add(pending(at=0.0))
    batch = b.take(0.0, ALL)
    assert batch is not None and len(batch.items) == 4 and batch.reason == "full"
    assert len(b) == 6


def test_deadline_reason_when_deadline_forces() -> None:
    b = make_batcher()
    b.add(pending(at=0.0, deadline=0.15))  # 0.15 - 0.1 - 0.02 = 0.03 < 0.05
    assert b.take(0.02, ALL) is None
    batch = b.take(0.03, ALL)
    assert batch is not None and batch.reason == "deadline"


def test_incompatible_keys_never_share_a_batch() -> None:
    b = make_batcher(max_batch=8)
    a, c = BatchKey("sim", "1", (("salt", "a"),)), BatchKey("sim", "1", (("salt", "b"),))
    for i in range(6):
        b.add(pending(key=a if i % 2 else c, at=0.0))
    first = b.take(1.0, ALL)
    second = b.take(1.0, ALL)
    assert first is not None and second is not None
    assert {p.key for p in first.items} != {p.key for p in second.items}
    assert len({p.key for p in first.items}) == 1 and len({p.key for p in second.items}) == 1


def test_higher_priority_fills_batch_first() -> None:
    b = make_batcher(max_batch=3)
    low = [b.add(pending(rank=3, at=0.0)) for _ in range(3)]
    assert low
    hi = pending(rank=0, at=0.01)
    b.add(hi)
    batch = b.take(1.0, ALL)
    assert batch is not None and batch.items[0] is hi


def test_ready_sync_key_beats_ready_jobs_key() -> None:
    b = make_batcher(max_batch=2)
    jobs_key, sync_key = BatchKey("sim", "1", (("salt", "j"),)), BatchKey("sim", "1")
    for _ in range(2):
        b.add(pending(key=jobs_key, rank=3, at=0.0))
    b.add(pending(key=sync_key, rank=0, at=0.5))
    batch = b.take(1.0, ALL)
    assert batch is not None and batch.key == sync_key


def test_worker_only_gets_models_it_serves() -> None:
    b = make_batcher()
    b.add(pending(key=BatchKey("embed", "1"), at=0.0))
    assert b.take(1.0, lambda ref: ref == ("sim", "1")) is None
    assert b.wake_at(lambda ref: ref == ("sim", "1")) == math.inf
    assert b.take(1.0, lambda ref: ref == ("embed", "1")) is not None


def test_requests_that_cannot_finish_are_dropped() -> None:
    b = make_batcher(compute_ms=100)
    doomed = pending(at=0.0, deadline=0.05)
    ok = pending(at=0.0, deadline=5.0)
    b.add(doomed)
    b.add(ok)
    dropped = b.drop_expired(0.0)
    assert dropped == [doomed]
    assert len(b) == 1
    batch = b.take(1.0, ALL)
    assert batch is not None and batch.items == [ok]


def test_a_request_kept_past_its_deadline_waits_under_the_later_one_then_expires() -> None:
    """Decision 63: a caller that takes a partial answer keeps the rest running."""
    b = make_batcher(compute_ms=100)
    kept = pending(at=0.0, deadline=0.05)
    kept.msg.extra[KEEP_UNTIL] = 3.0
    doomed = pending(at=0.0, deadline=0.05)
    doomed.msg.extra[KEEP_UNTIL] = "soon"  # not a time: expires as if absent
    b.add(kept)
    b.add(doomed)
    assert b.drop_expired(0.0) == [doomed]
    assert kept.deadline == 3.0 and kept.msg.deadline == 0.05  # the row keeps its own
    assert b.drop_expired(1.0) == [] and len(b) == 1
    # No longer urgent: it flushes by the linger, not by a deadline long past.
    assert b.wake_at(ALL) == pytest.approx(0.05)
    assert b.drop_expired(2.95) == [kept] and len(b) == 0


def test_a_kept_request_is_batched_like_any_other() -> None:
    b = make_batcher(compute_ms=100)
    kept = pending(at=0.0, deadline=0.05)
    kept.msg.extra[KEEP_UNTIL] = 3.0
    b.add(kept)
    assert b.drop_expired(0.0) == []
    batch = b.take(1.0, ALL)
    assert batch is not None and batch.items == [kept]


def test_drop_partitions_forgets_only_those() -> None:
    b = make_batcher()
    keep = pending(tp=("t", 0))
    gone = pending(tp=("t", 1))
    b.add(keep)
    b.add(gone)
    assert b.drop_partitions([("t", 1)]) == [gone]
    batch = b.take(1.0, ALL)
    assert batch is not None and batch.items == [keep]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 3)), max_size=60),
    st.integers(1, 7),
)
def test_property_batches_are_homogeneous_and_lose_nothing(
    reqs: list[tuple[str, int]], max_batch: int
) -> None:
    b = make_batcher(max_batch=max_batch)
    added = []
    for salt, rank in reqs:
        p = pending(key=BatchKey("sim", "1", (("salt", salt),)), rank=rank, at=0.0)
        b.add(p)
        added.append(p)
    seen = []
    while (batch := b.take(10.0, ALL)) is not None:
        assert 1 <= len(batch.items) <= max_batch
        assert len({p.key for p in batch.items}) == 1
        ranks = [p.rank for p in batch.items]
        assert ranks == sorted(ranks)
        seen.extend(batch.items)
    assert len(b) == 0
    assert sorted(p.msg.request_id for p in seen) == sorted(p.msg.request_id for p in added)


def test_job_backlog_does_not_start_while_sync_lingers_on_another_key() -> None:
    """A worker about to start a full job batch flushes the lingering sync queue first."""
    b = make_batcher(max_batch=4)
    jobs_key, sync_key = BatchKey("sim", "1", (("p", 1),)), BatchKey("sim", "1")
    for _ in range(8):
        b.add(pending(key=jobs_key, rank=3, at=0.0))
    b.add(pending(key=sync_key, rank=1, at=0.01))
    batch = b.take(0.011, ALL)
    assert batch is not None and batch.key == sync_key and batch.reason == "priority"
    assert [p.rank for p in batch.items] == [1]
    nxt = b.take(0.012, ALL)
    assert nxt is not None and nxt.key == jobs_key and nxt.reason == "full"


def test_sync_keeps_lingering_when_the_worker_would_otherwise_idle() -> None:
    b = make_batcher(max_batch=4)
    b.add(pending(rank=1, at=0.0))
    assert b.take(0.01, ALL) is None  # nothing else ready: wait to fill the batch


def test_ready_sync_is_not_preempted_by_a_lingering_more_urgent_queue_of_same_rank() -> None:
    b = make_batcher(max_batch=4)
    a, c = BatchKey("sim", "1", (("p", 1),)), BatchKey("sim", "1", (("p", 2),))
    for _ in range(4):
        b.add(pending(key=a, rank=1, at=0.0))
    b.add(pending(key=c, rank=1, at=0.0))
    batch = b.take(0.001, ALL)
    assert batch is not None and batch.key == a and batch.reason == "full"


def test_same_key_sync_items_ride_first_in_a_job_filled_batch() -> None:
    b = make_batcher(max_batch=4)
    for _ in range(6):
        b.add(pending(rank=3, at=0.0))
    b.add(pending(rank=0, at=0.5))
    batch = b.take(0.5, ALL)
    assert batch is not None and [p.rank for p in batch.items] == [0, 3, 3, 3]


def test_urgent_queue_on_a_model_the_worker_does_not_serve_is_ignored() -> None:
    b = make_batcher(max_batch=4)
    other = BatchKey("embed", "1")
    for _ in range(4):
        b.add(pending(rank=3, at=0.0))
    b.add(pending(key=other, rank=0, at=0.0))
    batch = b.take(0.001, lambda ref: ref[0] == "sim")
    assert batch is not None and batch.key.model == "sim" and batch.reason == "full"


# ---- may sync work wait for a staggered start? (Batcher.urgent_may_wait) -----------


def test_sync_with_job_fill_may_wait_for_the_stagger_point() -> None:
    b = make_batcher(max_batch=4)
    for _ in range(3):
        b.add(pending(rank=3, at=0.0))
    b.add(pending(rank=0, at=0.0, deadline=5.0))
    assert b.urgent_may_wait(3, ALL, 0.05)


def test_nothing_urgent_may_always_wait() -> None:
    b = make_batcher()
    b.add(pending(rank=3, at=0.0))
    assert b.urgent_may_wait(3, ALL, 0.05)


def test_sync_alone_never_waits_for_the_stagger() -> None:
    # No job items to fill with: the start is a sync batch, not background work.
    b = make_batcher(max_batch=4)
    b.add(pending(rank=0, at=0.0, deadline=5.0))
    assert not b.urgent_may_wait(3, ALL, 0.05)


def test_a_backlog_of_sync_work_may_wait_once_for_the_stagger_point() -> None:
    # Saturated workers that started together would stay together: spreading them costs
    # one hold, within the deadlines.
    b = make_batcher(max_batch=2)
    b.add(pending(rank=3, at=0.0))
    for _ in range(2):
        b.add(pending(rank=0, at=0.0, deadline=5.0))
    assert b.urgent_may_wait(3, ALL, 0.05)
    b.add(pending(rank=0, at=0.0, deadline=0.16))
    assert not b.urgent_may_wait(3, ALL, 0.05)  # one of them cannot wait


def test_sync_whose_deadline_is_near_goes_at_once() -> None:
    # 100 ms compute + 20 ms margin: a deadline at 0.16 cannot wait until 0.05.
    b = make_batcher(max_batch=4)
    b.add(pending(rank=3, at=0.0, deadline=60.0))
    b.add(pending(rank=0, at=0.0, deadline=0.16))
    assert not b.urgent_may_wait(3, ALL, 0.05)
    assert b.urgent_may_wait(3, ALL, 0.03)


def test_sync_for_a_model_this_worker_does_not_serve_is_ignored() -> None:
    b = make_batcher(max_batch=4)
    b.add(pending(key=BatchKey("embed", "1"), rank=0, at=0.0, deadline=0.01))
    b.add(pending(rank=3, at=0.0))
    assert b.urgent_may_wait(3, lambda ref: ref == ("sim", "1"), 0.05)
