"""Per-tenant fairness inside one priority class: deficit round robin. Pure.

Each tenant with queued requests has its own FIFO. Taking requests for a batch
visits tenants in turn; a visit adds the tenant's weight (from its plan) to its
deficit, and the tenant may take one request per whole unit of deficit. So a
tenant with a burst of 50,000 requests gets no more than its share of each
batch while another tenant of the same tier also has work waiting, and a
weight-2 tenant gets twice the share of a weight-1 tenant.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar


class Item(Protocol):
    gone: bool
    consumed_at: float

    @property
    def tenant(self) -> str: ...

    @property
    def weight(self) -> float: ...


T = TypeVar("T", bound=Item)


class FairQueue(Generic[T]):
    def __init__(self) -> None:
        self._queues: OrderedDict[str, deque[T]] = OrderedDict()  # active tenants, in turn order
        self._deficit: dict[str, float] = {}

    def append(self, item: T) -> None:
        q = self._queues.get(item.tenant)
        if q is None:
            q = self._queues[item.tenant] = deque()
            self._deficit[item.tenant] = 0.0
        q.append(item)

    def _head(self, tenant: str) -> T | None:
        q = self._queues[tenant]
        while q and q[0].gone:
            q.popleft()
        return q[0] if q else None

    def _drop_if_empty(self, tenant: str) -> bool:
        if self._head(tenant) is None:
            del self._queues[tenant]
            del self._deficit[tenant]
            return True
        return False

    def __bool__(self) -> bool:
        return any(self._head(t) is not None for t in list(self._queues))

    def oldest_at(self) -> float:
        heads = (self._head(t) for t in list(self._queues))
        return min((h.consumed_at for h in heads if h is not None), default=math.inf)

    def take(self, n: int) -> list[T]:
        """Up to ``n`` live items, shared among tenants by weighted deficit round robin."""
        out: list[T] = []
        while len(out) < n and self._queues:
            tenant = next(iter(self._queues))
            if self._drop_if_empty(tenant):
                continue
            q = self._queues[tenant]
            head = q[0]
            self._deficit[tenant] += max(head.weight, 1e-3)
            while self._deficit[tenant] >= 1.0 and len(out) < n:
                item = self._head(tenant)
                if item is None:
                    break
                q.popleft()
                out.append(item)
                self._deficit[tenant] -= 1.0
            if not self._drop_if_empty(tenant):
                self._queues.move_to_end(tenant)  # its turn is over; its deficit carries
        return out

    def __iter__(self) -> Iterator[T]:
        for q in self._queues.values():
            yield from (x for x in q if not x.gone)

    def heads(self) -> Iterator[T]:
        """Each tenant's oldest live item (the head of its FIFO)."""
        for tenant in list(self._queues):
            head = self._head(tenant)
            if head is not None:
                yield head

    def tenants(self) -> int:
        return len(self._queues)

    def depth_by_tenant(self) -> dict[str, tuple[int, float]]:
        """Live items and weight per tenant (O(items): for once-a-second reports)."""
        out: dict[str, tuple[int, float]] = {}
        for tenant, q in self._queues.items():
            live = [x for x in q if not x.gone]
            if live:
                out[tenant] = (len(live), live[0].weight)
        return out
