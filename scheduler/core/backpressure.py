"""Which priority classes to stop fetching from Kafka. Pure.

Memory stays bounded under any offered load: when a class has too many requests
buffered, its partitions are paused, and resumed once the buffer has drained to
half (hysteresis, so we do not flap). Job items get a smaller budget than sync
traffic: they only backfill, and a deep buffer of them would just sit in memory
while sync requests still need room.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BufferBudget:
    per_class: tuple[int, ...]  # max buffered requests per rank

    @classmethod
    def default(cls, max_buffered: int, n_ranks: int) -> BufferBudget:
        # sync classes may each fill the buffer; the last rank (jobs) a quarter of it
        return cls(tuple([max_buffered] * (n_ranks - 1) + [max(1, max_buffered // 4)]))


def paused_classes(
    depths: list[int], paused: frozenset[int], budget: BufferBudget
) -> frozenset[int]:
    out = set(paused)
    for rank, depth in enumerate(depths):
        limit = budget.per_class[rank]
        if depth >= limit:
            out.add(rank)
        elif depth < limit // 2:
            out.discard(rank)
    return frozenset(out)


# A lane whose every class is over budget stops taking messages for at most this long
# before pausing its partitions. Not taking them costs nothing: librdkafka stops
# fetching once its own bounded queue is full (queued.max.messages.kbytes), and what it
# prefetched is kept. A pause drops that prefetch (librdkafka purges a paused
# partition's queue) and the resume fetches it again: at the budget's edge a lane
# paused and resumed many times a second, and one scheduler read a job's items at a
# third of the rate its workers took them (docs/bench/store.md). But only a lane that
# polls serves its rebalance callbacks, so after this long (workers that stopped
# draining) it pauses and polls: a revocation then waits at most this, well inside
# the group's session timeout (decision 0006).
HOLD_MAX_S = 1.0


@dataclass(frozen=True)
class LaneHold:
    """How a lane holds back: classes paused in Kafka, and since when (epoch s) it has
    taken no messages without pausing (None: it takes them)."""

    paused: frozenset[int] = frozenset()
    held_since: float | None = None


def lane_hold(
    wanted: frozenset[int], ranks: frozenset[int], current: LaneHold, now: float
) -> LaneHold:
    """What a lane reading ``ranks`` does when ``wanted`` classes are over budget: if
    all of them are, it stops taking messages (and pauses them after ``HOLD_MAX_S``);
    if only some are, those are paused in Kafka so the others flow."""
    if ranks and wanted >= ranks:
        if current.paused >= ranks:
            return current
        since = now if current.held_since is None else current.held_since
        if now - since >= HOLD_MAX_S:
            return LaneHold(paused=ranks)
        return LaneHold(paused=current.paused, held_since=since)
    return LaneHold(paused=wanted & ranks)
