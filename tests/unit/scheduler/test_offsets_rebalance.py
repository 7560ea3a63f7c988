"""Offset bookkeeping under rebalances, by randomized (property-based) sequences.

A small model of Kafka (per-partition logs and committed positions), a result
store and two consumer-group members, each driving its own ``OffsetTracker``
the way ``scheduler/runtime/lane.py`` and ``scheduler/runtime/service.py`` do: track on
consume, done after persist, commit what is committable, commit then forget on revoke,
forget on loss. Results may land late and out of order, also after the partition moved on.

Invariants checked after every step:
  * per partition, every offset below the committed position has a result;
  * the committed position never moves backwards;
  * a member's bookkeeping covers only partitions it owns, and never counts
    a negative or stale amount of work in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from scheduler.core.offsets import OffsetTracker

TPS = [("gm.requests.paid", 0), ("gm.requests.paid", 1), ("gm.requests.free", 0)]
TP = tuple[str, int]


@dataclass
class Member:
    tracker: OffsetTracker = field(default_factory=OffsetTracker)
    owned: set[TP] = field(default_factory=set)
    fetch: dict[TP, int] = field(default_factory=dict)  # next offset to read
    in_flight: list[tuple[TP, int]] = field(default_factory=list)  # consumed, not persisted


class RebalanceMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.log_end = dict.fromkeys(TPS, 0)
        self.committed: dict[TP, int] = {}
        self.high_commit: dict[TP, int] = {}
        self.persisted: set[tuple[TP, int]] = set()
        self.members = [Member(), Member()]
        for i, tp in enumerate(TPS):
            self._assign(self.members[i % 2], tp)

    # ---- helpers mirroring scheduler/runtime/service.py --------------------------------------
    def _assign(self, m: Member, tp: TP) -> None:
        m.owned.add(tp)
        m.fetch[tp] = self.committed.get(tp, 0)  # Kafka resumes from the committed offset

    def _commit(self, m: Member, only: set[TP] | None = None) -> None:
        positions = m.tracker.committable()
        if only is not None:
            positions = {tp: o for tp, o in positions.items() if tp in only}
        for tp, pos in positions.items():
            assert tp in m.owned, "a member committed a partition it does not own"
            self.committed[tp] = pos
        m.tracker.mark_committed(positions)

    def _owner(self, tp: TP) -> Member:
        return next(m for m in self.members if tp in m.owned)

    # ---- rules -----------------------------------------------------------------------
    @rule(tp=st.sampled_from(TPS), n=st.integers(1, 5))
    def produce(self, tp: TP, n: int) -> None:
        self.log_end[tp] += n

    @rule(tp=st.sampled_from(TPS), n=st.integers(1, 4))
    def consume(self, tp: TP, n: int) -> None:
        m = self._owner(tp)
        for _ in range(n):
            o = m.fetch[tp]
            if o >= self.log_end[tp]:
                return
            m.fetch[tp] = o + 1
            m.tracker.track(tp, o)
            m.in_flight.append((tp, o))

    @rule(who=st.integers(0, 1), pick=st.integers(0, 10_000), n=st.integers(1, 4))
    def persist(self, who: int, pick: int, n: int) -> None:
        """A batch (any items, any partitions, any order) is written, then marked done."""
        m = self.members[who]
        for _ in range(min(n, len(m.in_flight))):
            tp, o = m.in_flight.pop(pick % len(m.in_flight))
            self.persisted.add((tp, o))
            m.tracker.done(tp, o)

    @rule(who=st.integers(0, 1), pick=st.integers(0, 10_000))
    def batch_done_twice(self, who: int, pick: int) -> None:
        """A redelivered message finishes again (the upsert keeps one row)."""
        done = sorted(self.persisted)
        if done:
            tp, o = done[pick % len(done)]
            self.members[who].tracker.done(tp, o)

    @rule(who=st.integers(0, 1))
    def commit(self, who: int) -> None:
        self._commit(self.members[who])

    @rule(tp=st.sampled_from(TPS))
    def revoke_and_move(self, tp: TP) -> None:
        """Cooperative revocation: commit what is safe, forget, the other member takes over.
        In-flight work of the old owner keeps running and may land later."""
        old = self._owner(tp)
        new = self.members[1 - self.members.index(old)]
        self._commit(old, only={tp})
        old.tracker.forget([tp])
        old.owned.discard(tp)
        self._assign(new, tp)

    @rule(tp=st.sampled_from(TPS))
    def lose_and_move(self, tp: TP) -> None:
        """Session timeout: no commit at all, the partition moves."""
        old = self._owner(tp)
        new = self.members[1 - self.members.index(old)]
        old.tracker.forget([tp])
        old.owned.discard(tp)
        self._assign(new, tp)

    @rule(who=st.integers(0, 1))
    def crash(self, who: int) -> None:
        """kill -9: in-flight work and bookkeeping vanish; a fresh process rejoins."""
        m = self.members[who]
        owned = set(m.owned)
        self.members[who] = fresh = Member()
        for tp in owned:
            self._assign(fresh, tp)

    @precondition(lambda self: any(m.in_flight for m in self.members))
    @rule()
    def drain(self) -> None:
        """Everything in flight lands and every member commits: the positions catch up."""
        for m in self.members:
            for tp, o in m.in_flight:
                self.persisted.add((tp, o))
                m.tracker.done(tp, o)
            m.in_flight.clear()
            self._commit(m)
        for tp in TPS:
            m = self._owner(tp)
            if m.tracker.position(tp) is not None:
                assert self.committed[tp] == m.fetch[tp]

    # ---- invariants ------------------------------------------------------------------
    @invariant()
    def commit_never_passes_unpersisted(self) -> None:
        for tp, pos in self.committed.items():
            missing = [o for o in range(pos) if (tp, o) not in self.persisted]
            assert not missing, f"{tp} committed at {pos} but {missing} have no result"

    @invariant()
    def commit_never_goes_back(self) -> None:
        for tp, pos in self.committed.items():
            assert pos >= self.high_commit.get(tp, 0), f"{tp} went back to {pos}"
            self.high_commit[tp] = pos

    @invariant()
    def bookkeeping_only_for_owned_partitions(self) -> None:
        for m in self.members:
            assert set(m.tracker.partitions()) <= m.owned
            for tp in m.tracker.partitions():
                # Never more than the work this member really has running for it.
                running = {o for t, o in m.in_flight if t == tp}
                assert 0 <= m.tracker.in_flight(tp) <= len(running)


RebalanceMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None
)
TestRebalance = RebalanceMachine.TestCase


def test_late_result_after_reassignment_only_counts_if_in_flight_again() -> None:
    t = OffsetTracker()
    tp = TPS[0]
    for o in range(3):
        t.track(tp, o)
    t.forget([tp])  # revoked with 0..2 in flight
    t.track(tp, 0)  # came back; Kafka redelivers from the committed offset 0
    t.done(tp, 2)  # a late result from before: not in flight now, ignored
    assert t.in_flight(tp) == 1 and t.committable() == {tp: 0}
    t.done(tp, 0)  # the old owner's late write of offset 0 is durable: safe to pass
    assert t.committable() == {tp: 1}
    t.done(tp, 0)
    assert t.in_flight(tp) == 0


def test_redelivered_offset_in_flight_twice_is_tracked_once() -> None:
    t = OffsetTracker()
    tp = TPS[0]
    t.track(tp, 5)
    t.track(tp, 5)
    t.done(tp, 5)
    assert t.in_flight() == 0 and t.committable() == {tp: 6}
