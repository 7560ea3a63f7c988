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


class Turns(Generic[K, T]):
    """Deficit round robin's turns over keyed queues, for both levels of the fair queue
    (tenants in fairness.py, a tenant's flows here): ``_ring`` holds the keys with work in
    turn order, ``_deficit`` what each has banked, ``_credited`` whether the front key got
    its current turn's credit. A subclass says what a key's next live item is, what a turn
    credits and how a key with nothing left is dropped."""

    _ring: OrderedDict[K, Any]
    _deficit: dict[K, float]
    _credited: bool
    _price: Callable[[T], float]

    def _front_of(self, key: K) -> T | None:
        raise NotImplementedError

    def _credit(self, head: T) -> float:
        raise NotImplementedError

    def _drop(self, key: K) -> None:
        raise NotImplementedError

    def _affordable(self, *, lone_free: bool) -> T | None:
        """The next item its key's deficit pays for, crediting the front key once a turn
        and passing the turn on while its head costs more than it has; stable until taken.
        ``lone_free``: a key alone keeps no accounts and is served outright."""
        ring = self._ring
        misses = 0
        while ring:
            key = next(iter(ring))
            head = self._front_of(key)
            if head is None:
                self._drop(key)
                continue
            if lone_free and len(ring) == 1:
                return head
            if not self._credited:  # the front key's turn begins
                self._deficit[key] += self._credit(head)
                self._credited = True
            if self._price(head) <= self._deficit[key]:
                return head
            misses += 1
            if misses > len(ring):
                # A whole round served nobody (heads dearer than a turn's credit): grant at
                # once the rounds the nearest key still needs instead of looping through them.
                heads = {k: h for k in ring if (h := self._front_of(k)) is not None}
                grant_idle_rounds(self._deficit, heads, self._price, self._credit)
                misses = 0
            ring.move_to_end(key)  # its turn is over; its deficit carries
            self._credited = False
        return None


class Flows(Turns[Hashable, T]):
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
        self._ring: OrderedDict[Hashable, Any] = OrderedDict()  # each flow's queue, turn order
        self._deficit: dict[Hashable, float] = {}
        self._credited = False  # whether the front flow got its current turn's credit
        # The queue while there is exactly one flow (the common case), else None: the hot
        # paths below read it without walking the ordered dict.
        self._only: Any = None

    def append(self, item: T, flow: Hashable) -> None:
        q = self._ring.get(flow)
        if q is None:
            q = self._ring[flow] = (
                deque() if self._order is None else Earliest(self._order, self._seq)
            )
            self._deficit[flow] = 0.0
            self._only = q if len(self._ring) == 1 else None
        q.append(item)

    def remove(self, item: T, flow: Hashable) -> None:
        q = self._ring.get(flow)
        if q is not None and item in q:
            q.remove(item)
            if not q:
                self._drop(flow)

    def _front(self, q: Any) -> T | None:
        if self._lazy:
            while q and q[0].gone:
                q.popleft()
        return q[0] if q else None

    def _front_of(self, flow: Hashable) -> T | None:
        return self._front(self._ring[flow])

    def _credit(self, _head: T) -> float:
        return self._quantum  # the flows of one key are equals

    def _drop(self, flow: Hashable) -> None:
        if next(iter(self._ring)) == flow:
            self._credited = False
        del self._ring[flow]
        del self._deficit[flow]  # an idle flow banks no credit
        self._only = None
        if len(self._ring) == 1:  # a lone flow keeps no accounts (it starts fresh)
            self._deficit[next(iter(self._ring))] = 0.0
            self._credited = False
            self._only = next(iter(self._ring.values()))

    def head(self) -> T | None:
        """The item ``pop`` takes next (None when no live item is left)."""
        q = self._only
        if q is not None:  # a lone flow: its FIFO's head (the hot path)
            if self._lazy:
                while q and q[0].gone:
                    q.popleft()
            if q:
                return q[0]
        return self._affordable(lone_free=True)

    def pop(self) -> T:
        h = self.head()
        if h is None:
            raise IndexError("pop from empty Flows")
        flow, q = next(iter(self._ring.items()))
        q.popleft()
        if len(self._ring) > 1:
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
                self._drop(next(iter(self._ring)))
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
        return sum(len(q) for q in self._ring.values())

    def __bool__(self) -> bool:
        return any(self._front(q) is not None for q in list(self._ring.values()))

    def __iter__(self) -> Iterator[T]:
        for q in self._ring.values():
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
        for q in list(self._ring.values()):
            x = self._front(q)
            if x is not None:
                yield x

    def flows(self) -> int:
        return len(self._ring)


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
    instead of looping through them (``Turns._affordable``, for both levels)."""
    rounds = min(math.ceil((price(h) - deficit[k]) / credit(h)) for k, h in heads.items())
    for k, h in heads.items():
        deficit[k] += (rounds - 1) * credit(h)
