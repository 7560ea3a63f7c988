"""Per-tenant fairness inside one priority class: deficit round robin by cost. Pure.

One fair queue serves both engines. Each tenant with queued items has its own FIFO;
tenants take turns, and a turn credits ``quantum * weight`` (the weight from the
tenant's plan) to the tenant's deficit; the tenant is served while its head's cost fits
its deficit, and what is left carries to its next turn (Shreedhar and Varghese's DRR for
variable-size packets). An idle tenant banks no credit.

* Batching counts device time: an item costs its estimated device time relative to an
  item of the recent mean length (scheduler/core/itemcost.py; the quantum is 1), so a
  tenant of 256-token inputs gets no more of the device than a tenant of 8-token inputs
  at the same weight, a tenant with a burst of 50,000 requests gets no more than its
  share of each batch while another tenant of the same tier also has work waiting, and
  a weight-2 tenant gets twice the device time of a weight-1 tenant (decisions 9, 65).
  ``take(n)`` fills a batch; a turn the batch cut short goes on in the next one.
* Generation counts tokens: a request's claim on the KV cache (prompt plus max_tokens)
  varies a hundredfold, so one request per turn would let a tenant of long requests
  hold most of the cache. ``peek`` shows the next request without taking it (admission
  may still find no room for it) and ``pop`` takes it; a turn lasts across calls.

Inside a tenant, its flows (``flow``: a gateway's fairness id, flows.py) take turns the
same way, so one end user's burst cannot starve the key's others; the tenant's deficit,
and so its share against other tenants, does not depend on how many flows it has
(decision 58).

Inside a flow, items go in arrival order, or earliest ``order`` first (the batcher's
deadline: earliest deadline first, decision 65).

Items leave eagerly (``remove``, ``pop``) or, when they carry a ``gone`` flag, lazily:
one whose flag is set (the batcher drops expired and revoked requests that way) is
passed over and forgotten.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

from scheduler.core.flows import Flows, Turns, flow_of


class Item(Protocol):
    @property
    def tenant(self) -> str: ...

    @property
    def weight(self) -> float: ...


T = TypeVar("T", bound=Item)
# The least weight a turn credits: a tenant whose weight rounds to nothing still moves.
MIN_WEIGHT = 1e-3


def _one(_item: object) -> float:
    return 1.0


def _consumed_at(item: Any) -> float:
    return float(item.consumed_at)


class FairQueue(Turns[str, T]):
    def __init__(
        self,
        quantum: float = 1.0,
        cost: Callable[[T], float] | None = None,
        order: Callable[[T], float] | None = None,
    ):
        """``cost``: what serving an item spends of its tenant's deficit (none: 1);
        ``order``: inside a flow, items go earliest by this first (none: FIFO)."""
        self._quantum = quantum
        self._order = order
        self._cost = cost
        self._price: Callable[[T], float] = _one if cost is None else cost
        self._ring: OrderedDict[str, Flows[T]] = OrderedDict()  # active tenants, turn order
        self._deficit: dict[str, float] = {}
        self._credited = False  # whether the front tenant got its current turn's credit
        self._lazy = False  # the items carry ``gone`` (seen on the first one queued)

    # ---- queueing ------------------------------------------------------------------------
    def append(self, item: T) -> None:
        if not self._ring:
            self._lazy = hasattr(item, "gone")
        q = self._ring.get(item.tenant)
        if q is None:
            q = self._ring[item.tenant] = Flows(self._quantum, self._price, self._lazy, self._order)
            self._deficit[item.tenant] = 0.0
        q.append(item, getattr(item, "flow", None))  # flow_of, inline: once per request

    push = append

    def remove(self, item: T) -> None:
        q = self._ring.get(item.tenant)
        if q is not None:
            q.remove(item, flow_of(item))
            if not q.flows():
                self._drop(item.tenant)

    def _front_of(self, tenant: str) -> T | None:
        """The tenant's next live item (its flows' turn decides which)."""
        return self._ring[tenant].head()

    def _drop(self, tenant: str, *, front: bool = False) -> None:
        if front or next(iter(self._ring)) == tenant:
            self._credited = False
        del self._ring[tenant]
        del self._deficit[tenant]  # an idle tenant banks no credit (DRR)

    def _credit(self, head: T) -> float:
        return self._quantum * max(head.weight, MIN_WEIGHT)

    # ---- batching: a batch at a time -----------------------------------------------------
    def take(self, n: int) -> list[T]:
        """Up to ``n`` live items, shared among tenants by weighted deficit round robin;
        a tenant's turn ends with the batch."""
        out: list[T] = []
        while len(out) < n and self._ring:
            tenant = next(iter(self._ring))
            q = self._ring[tenant]
            head = q.head()
            if head is None:
                self._drop(tenant, front=True)
                continue
            if not self._credited:
                self._deficit[tenant] += self._credit(head)
            self._credited = False
            self._deficit[tenant] = q.take(self._deficit[tenant], n, out)
            if not q.flows():  # (a flow of only gone items is dropped on its next turn)
                self._drop(tenant, front=True)
            elif len(out) >= n and self._affords(tenant):
                # The batch is full mid-turn: the turn goes on in the next batch. Ending it
                # here would cost a tenant of cheap items the rest of its credit whenever
                # a batch holds fewer of them than a turn buys, and hand the device to
                # the tenant of dear ones (decision 65).
                self._credited = True
            else:
                self._ring.move_to_end(tenant)  # its turn is over; its deficit carries
        return out

    def _affords(self, tenant: str) -> bool:
        head = self._front_of(tenant)
        return head is not None and self._price(head) <= self._deficit[tenant]

    # ---- generation: an item at a time ---------------------------------------------------
    def peek(self) -> T | None:
        """The item ``pop`` takes next (None if empty); its tenant's turn goes on."""
        return self._affordable(lone_free=False)

    def pop(self) -> T:
        head = self.peek()
        if head is None:
            raise IndexError("pop from an empty FairQueue")
        tenant = head.tenant
        q = self._ring[tenant]
        q.pop()
        self._deficit[tenant] -= self._price(head)
        if not q.flows():
            self._drop(tenant, front=True)
        return head

    # ---- views -----------------------------------------------------------------------------
    def __len__(self) -> int:
        """Items held (lazily dropped ones until they are passed over)."""
        return sum(len(q) for q in self._ring.values())

    def __bool__(self) -> bool:
        return any(self._ring.values())

    def __iter__(self) -> Iterator[T]:
        for q in self._ring.values():
            yield from q

    def oldest_at(self) -> float:
        """When the oldest live item was consumed (items that carry ``consumed_at``)."""
        return min((q.least(_consumed_at) for q in self._ring.values()), default=math.inf)

    def heads(self) -> Iterator[T]:
        """Each flow's oldest live item (the head of its FIFO), tenant by tenant."""
        for q in list(self._ring.values()):
            yield from q.fronts()

    def tenants(self) -> int:
        return len(self._ring)

    def weights(self) -> dict[str, float]:
        """The weight of each tenant with items queued (O(tenants): read per batch)."""
        out: dict[str, float] = {}
        for tenant, q in self._ring.items():
            head = next(q.fronts(), None)
            if head is not None:
                out[tenant] = head.weight
        return out

    def depth_by_tenant(self) -> dict[str, tuple[int, float]]:
        """Live items and weight per tenant (O(items): for once-a-second reports)."""
        out: dict[str, tuple[int, float]] = {}
        for tenant, q in self._ring.items():
            live = list(q)
            if live:
                out[tenant] = (len(live), live[0].weight)
        return out
