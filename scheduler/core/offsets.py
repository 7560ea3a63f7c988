"""Offset bookkeeping: commit per partition only up to the lowest unfinished offset.

Batches mix partitions and finish out of order, so the committable position of
a partition is the smallest offset consumed but not yet persisted (or one past
the highest consumed when nothing is pending). A heap with lazy deletion keeps
that O(log n) per operation. Pure logic; no Kafka here.

A ``done`` for an offset that is not in flight here (a late result from before a
revocation, or a second completion of the same message) changes nothing, so a
partition that comes back after a rebalance starts from clean bookkeeping.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

TopicPartition = tuple[str, int]


@dataclass
class _PartitionState:
    pending: list[int] = field(default_factory=list)  # min-heap, lazily cleaned
    unfinished: set[int] = field(default_factory=set)  # the offsets really in flight
    next_offset: int | None = None  # one past the highest offset consumed
    committed: int | None = None  # last position handed to Kafka


class OffsetTracker:
    def __init__(self) -> None:
        self._parts: dict[TopicPartition, _PartitionState] = {}

    def track(self, tp: TopicPartition, offset: int) -> None:
        """A message was consumed and is now in flight."""
        st = self._parts.setdefault(tp, _PartitionState())
        if offset not in st.unfinished:  # a redelivery of a message already in flight
            st.unfinished.add(offset)
            heapq.heappush(st.pending, offset)
        if st.next_offset is None or offset + 1 > st.next_offset:
            st.next_offset = offset + 1

    def done(self, tp: TopicPartition, offset: int) -> None:
        """The message's result is durable in PostgreSQL."""
        st = self._parts.get(tp)
        if st is None or offset not in st.unfinished:  # revoked meanwhile, or already done
            return
        st.unfinished.discard(offset)
        while st.pending and st.pending[0] not in st.unfinished:
            heapq.heappop(st.pending)

    def position(self, tp: TopicPartition) -> int | None:
        """The offset a consumer restarting now should begin at (Kafka's commit semantics)."""
        st = self._parts.get(tp)
        if st is None or st.next_offset is None:
            return None
        return st.pending[0] if st.pending else st.next_offset

    def in_flight(self, tp: TopicPartition | None = None) -> int:
        parts = [self._parts.get(tp)] if tp is not None else list(self._parts.values())
        return sum(len(st.unfinished) for st in parts if st is not None)

    def committable(self) -> dict[TopicPartition, int]:
        """Positions that moved since the last ``mark_committed``."""
        out: dict[TopicPartition, int] = {}
        for tp, st in self._parts.items():
            pos = self.position(tp)
            if pos is not None and pos != st.committed:
                out[tp] = pos
        return out

    def mark_committed(self, positions: dict[TopicPartition, int]) -> None:
        for tp, pos in positions.items():
            st = self._parts.get(tp)
            if st is not None and (st.committed is None or pos > st.committed):
                st.committed = pos

    def forget(self, tps: list[TopicPartition]) -> None:
        """The partitions were revoked: their unfinished work now belongs to another member."""
        for tp in tps:
            self._parts.pop(tp, None)

    def partitions(self) -> list[TopicPartition]:
        return list(self._parts)
