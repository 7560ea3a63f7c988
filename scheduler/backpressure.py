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
