"""Offset bookkeeping: a commit never passes a message whose result is unsaved."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.offsets import OffsetTracker

TP = ("topic", 0)


def test_nothing_consumed_nothing_to_commit() -> None:
    assert OffsetTracker().committable() == {}


def test_commits_up_to_lowest_unfinished() -> None:
    t = OffsetTracker()
    for o in range(5):
        t.track(TP, o)
    t.done(TP, 3)
    t.done(TP, 0)
    assert t.committable() == {TP: 1}
    t.done(TP, 1)
    t.done(TP, 2)
    assert t.committable() == {TP: 4}
    t.done(TP, 4)
    assert t.committable() == {TP: 5}


def test_committed_position_is_not_offered_again() -> None:
    t = OffsetTracker()
    t.track(TP, 7)
    t.done(TP, 7)
    assert t.committable() == {TP: 8}
    t.mark_committed({TP: 8})
    assert t.committable() == {}


def test_partitions_are_independent() -> None:
    t = OffsetTracker()
    a, b = ("x", 0), ("x", 1)
    t.track(a, 10)
    t.track(b, 20)
    t.done(b, 20)
    assert t.committable() == {a: 10, b: 21}


def test_forget_drops_revoked_partition_and_ignores_late_done() -> None:
    t = OffsetTracker()
    t.track(TP, 1)
    t.forget([TP])
    t.done(TP, 1)
    assert t.committable() == {}
    assert t.in_flight() == 0


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 80), st.integers(0, 2**32), st.integers(1, 3))
def test_property_commit_never_passes_unfinished(n: int, seed: int, parts: int) -> None:
    rng = random.Random(seed)
    t = OffsetTracker()
    tps = [("t", p) for p in range(parts)]
    consumed = {tp: list(range(rng.randint(0, 5), 0, -1)) for tp in tps}  # unused start
    offsets = {tp: list(range(100, 100 + n)) for tp in tps}
    for tp in tps:
        for o in offsets[tp]:
            t.track(tp, o)
    assert consumed
    finished: dict[tuple[str, int], set[int]] = {tp: set() for tp in tps}
    pending = [(tp, o) for tp in tps for o in offsets[tp]]
    rng.shuffle(pending)
    for tp, o in pending:
        t.done(tp, o)
        finished[tp].add(o)
        for ctp, pos in t.committable().items():
            # every offset below the committed position must be finished
            assert all(x in finished[ctp] for x in range(100, pos))
            # and the position is as far as it can be
            unfinished = [x for x in offsets[ctp] if x not in finished[ctp]]
            assert pos == (min(unfinished) if unfinished else 100 + n)
        if rng.random() < 0.3:
            t.mark_committed(t.committable())
    assert all(pos == 100 + n for pos in (t.position(tp) for tp in tps))
