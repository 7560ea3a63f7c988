"""One tenant's queued items, by flow: the second level of the fair queue. Pure.

A flow is what a gateway names in ``x-gateway-inference-fairness-id`` (an end user of
the tenant's key); requests without it are the tenant's default flow (None). Inside
its tenant's turn the tenant's flows take turns by deficit round robin, each credited
the same ``quantum`` a turn (flows of one key are equals), so one flow's burst cannot
starve the key's other users (decision 58). What a tenant may spend is decided one
level up (fairness.py) by its weight alone: flows only choose which of the tenant's
items is next, so a tenant gains nothing over other tenants by using many flows.

``head`` is stable until ``pop``: it credits the front flow at most once a turn and
may be called again (the tenant level peeks, is refused for want of deficit, and comes
back). A lone flow is served in its own order with no accounts kept: there is nobody to
be fair to, and it starts fresh when a second flow arrives. An idle flow banks no credit.

A flow's own order is arrival (FIFO), or with ``order`` earliest first by that key (the
batcher passes the deadline: earliest deadline first inside a flow, decision 65), ties
in arrival order.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


class Earliest(Generic[T]):
    """A flow's queue served earliest ``order`` first: the few calls a FIFO deque gets
    here (``[0]``, ``popleft``, ``append``, ``remove``), on a heap."""

    __slots__ = ("_heap", "_order", "_seq")

    def __init__(self, order: Callable[[T], float], seq: Iterator[int]):
        self._heap: list[tuple[float, int, T]] = []
        self._order = order
        self._seq = seq  # shared by the flows of a queue: ties go in arrival order

    def __getitem__(self, i: int) -> T:
        if i != 0:
            raise IndexError("only the head of an Earliest is read")
        return self._heap[0][2]

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[T]:
        return (e[2] for e in self._heap)

    def append(self, item: T) -> None:
        heapq.heappush(self._heap, (self._order(item), next(self._seq), item))

    def popleft(self) -> T:
        return heapq.heappop(self._heap)[2]

    def remove(self, item: T) -> None:
        self._heap = [e for e in self._heap if e[2] is not item]
        heapq.heapify(self._heap)


class Flows(Generic[T]):
    def __init__(
        self,
        quantum: float,
        price: Callable[[T], float],
        lazy: bool,
        order: Callable[[T], float] | None = None,
    ):
        """``price``: what serving an item spends of its flow's deficit; ``lazy``: the
        items carry a ``gone`` flag, and gone ones are passed over and forgotten;
        ``order``: a flow serves its items earliest by this first (None: FIFO)."""
        self._quantum = quantum
        self._price = price
        self._lazy = lazy
        self._order = order
        self._seq = itertools.count()
        self._fifos: OrderedDict[Hashable, Any] = OrderedDict()  # turn order
        self._deficit: dict[Hashable, float] = {}
        self._credited = False  # whether the front flow got its current turn's credit
        # The queue while there is exactly one flow (the common case), else None: the hot
        # paths below read it without walking the ordered dict.
        self._only: Any = None

    def append(self, item: T, flow: Hashable) -> None:
        q = self._fifos.get(flow)
        if q is None:
            q = self._fifos[flow] = (
                deque() if self._order is None else Earliest(self._order, self._seq)
            )
            self._deficit[flow] = 0.0
            self._only = q if len(self._fifos) == 1 else None
        q.append(item)

    def remove(self, item: T, flow: Hashable) -> None:
        q = self._fifos.get(flow)
        if q is not None and item in q:
            q.remove(item)
            if not q:
                self._drop(flow)

    def _front(self, q: Any) -> T | None:
        if self._lazy:
            while q and q[0].gone:
                q.popleft()
        return q[0] if q else None

    def _drop(self, flow: Hashable) -> None:
        if next(iter(self._fifos)) == flow:
            self._credited = False
        del self._fifos[flow]
        del self._deficit[flow]  # an idle flow banks no credit
        self._only = None
        if len(self._fifos) == 1:  # a lone flow keeps no accounts (it starts fresh)
            self._deficit[next(iter(self._fifos))] = 0.0
            self._credited = False
            self._only = next(iter(self._fifos.values()))

    def head(self) -> T | None:
        """The item ``pop`` takes next (None when no live item is left)."""
        q = self._only
        if q is not None:  # a lone flow: its FIFO's head (the hot path)
            if self._lazy:
                while q and q[0].gone:
                    q.popleft()
            if q:
                return q[0]
        misses = 0
        while self._fifos:
            flow, q = next(iter(self._fifos.items()))
            h = self._front(q)
            if h is None:
                self._drop(flow)
                continue
            if len(self._fifos) == 1:
                return h
            if not self._credited:  # the front flow's turn begins
                self._deficit[flow] += self._quantum
                self._credited = True
            if self._price(h) <= self._deficit[flow]:
                return h
            misses += 1
            if misses > len(self._fifos):
                # A round served nobody (items dearer than a quantum): grant at once the
                # rounds the nearest flow still needs instead of looping through them.
                fronts = {
                    f: x for f, fq in self._fifos.items() if (x := self._front(fq)) is not None
                }
                grant_idle_rounds(self._deficit, fronts, self._price, lambda _x: self._quantum)
                misses = 0
            self._fifos.move_to_end(flow)  # its turn is over; its deficit carries
            self._credited = False
        return None

    def pop(self) -> T:
        h = self.head()
        if h is None:
            raise IndexError("pop from empty Flows")
        flow, q = next(iter(self._fifos.items()))
        q.popleft()
        if len(self._fifos) > 1:
            self._deficit[flow] -= self._price(h)
        if not q:
            self._drop(flow)
        return h

    def take(self, budget: float, n: int, out: list[T]) -> float:
        """Items into ``out``, in turn, while the next one's price fits ``budget`` and
        ``out`` holds fewer than ``n``; returns what is left of ``budget``."""
        q = self._only
        if q is not None:  # the common case, one flow: the batcher's hot loop
            price, lazy = self._price, self._lazy
            while len(out) < n:
                if lazy:
                    while q and q[0].gone:
                        q.popleft()
                if not q:
                    break
                cost = price(q[0])
                if cost > budget:
                    break
                out.append(q.popleft())
                budget -= cost
            if not q:
                self._drop(next(iter(self._fifos)))
            return budget
        head = self.head()
        while len(out) < n and head is not None:
            cost = self._price(head)
            if cost > budget:
                break
            out.append(self.pop())
            budget -= cost
            head = self.head()
        return budget

    # ---- views -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return sum(len(q) for q in self._fifos.values())

    def __bool__(self) -> bool:
        return any(self._front(q) is not None for q in list(self._fifos.values()))

    def __iter__(self) -> Iterator[T]:
        for q in self._fifos.values():
            yield from (x for x in q if not (self._lazy and x.gone))

    def least(self, key: Callable[[T], float]) -> float:
        """The least ``key`` of the flows' oldest live items (inf if none): a lone flow
        without building a generator, since the scheduler asks at every step."""
        q = self._only
        if q is not None:
            if self._lazy:
                while q and q[0].gone:
                    q.popleft()
            return key(q[0]) if q else math.inf
        return min((key(x) for x in self.fronts()), default=math.inf)

    def fronts(self) -> Iterator[T]:
        """Each flow's oldest live item (the head of its FIFO), whoever is served next."""
        for q in list(self._fifos.values()):
            x = self._front(q)
            if x is not None:
                yield x

    def flows(self) -> int:
        return len(self._fifos)


def flow_of(item: Any) -> Hashable:
    """The flow an item belongs to: its ``flow`` (None, the default flow, if it has none)."""
    return getattr(item, "flow", None)


def grant_idle_rounds(
    deficit: dict[K, float],
    heads: Mapping[K, T],
    price: Callable[[T], float],
    credit: Callable[[T], float],
) -> None:
    """A whole round of turns served nobody (heads dearer than their credit): grant at
    once the rounds the nearest of them still needs, less the one its next turn credits,
    instead of looping through them. Both levels of the fair queue use it."""
    rounds = min(math.ceil((price(h) - deficit[k]) / credit(h)) for k, h in heads.items())
    for k, h in heads.items():
        deficit[k] += (rounds - 1) * credit(h)
