"""Per-tenant fairness inside one priority class, with requests of unequal cost.

Deficit round robin as in scheduler/core/fairness.py (decision 9), but counted in tokens
rather than requests: a generation request's claim on the KV cache (prompt plus
max_tokens) varies a hundredfold, so one request per turn would let a tenant of long
requests hold most of the cache. A tenant's turn credits ``quantum * weight`` tokens;
it admits requests while its head's cost fits its deficit (Shreedhar and Varghese's
DRR for variable-size packets). ``peek`` shows the next request without taking it,
because admission may still find no room for it; ``pop`` takes it.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar


class Costed(Protocol):
    @property
    def tenant(self) -> str: ...

    @property
    def weight(self) -> float: ...


T = TypeVar("T", bound=Costed)


class TokenDRR(Generic[T]):
    def __init__(self, quantum: int, cost: Callable[[T], int]):
        self._quantum = quantum
        self._cost = cost
        self._queues: OrderedDict[str, deque[T]] = OrderedDict()  # active tenants, turn order
        self._deficit: dict[str, float] = {}
        self._turn_credited = False  # whether the front tenant got its current turn's credit

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def __iter__(self) -> Iterator[T]:
        for q in self._queues.values():
            yield from q

    def push(self, item: T) -> None:
        q = self._queues.get(item.tenant)
        if q is None:
            q = self._queues[item.tenant] = deque()
            self._deficit[item.tenant] = 0.0
        q.append(item)

    def remove(self, item: T) -> None:
        q = self._queues.get(item.tenant)
        if q is not None and item in q:
            q.remove(item)
            if not q:
                self._drop(item.tenant)

    def _credit(self, tenant: str) -> float:
        q = self._queues[tenant]
        return self._quantum * max(q[0].weight, 1e-3)

    def _drop(self, tenant: str) -> None:
        if next(iter(self._queues)) == tenant:
            self._turn_credited = False
        del self._queues[tenant]
        del self._deficit[tenant]  # an idle tenant banks no credit (DRR)

    def peek(self) -> T | None:
        misses = 0
        while self._queues:
            tenant, q = next(iter(self._queues.items()))
            if not self._turn_credited:  # the front tenant's turn begins
                self._deficit[tenant] += self._credit(tenant)
                self._turn_credited = True
            head = q[0]
            if self._cost(head) <= self._deficit[tenant]:
                return head
            misses += 1
            if misses > len(self._queues):
                # A whole round served nobody (small weights, big requests): grant at once
                # the rounds the nearest tenant still needs, instead of looping through them.
                rounds = min(
                    math.ceil((self._cost(q2[0]) - self._deficit[t2]) / self._credit(t2))
                    for t2, q2 in self._queues.items()
                )
                for t2 in self._queues:
                    self._deficit[t2] += (rounds - 1) * self._credit(t2)
                misses = 0
            self._queues.move_to_end(tenant)  # its turn is over; its deficit carries
            self._turn_credited = False
        return None

    def pop(self) -> T:
        head = self.peek()
        if head is None:
            raise IndexError("pop from an empty TokenDRR")
        tenant = head.tenant
        self._queues[tenant].popleft()
        self._deficit[tenant] -= self._cost(head)
        if not self._queues[tenant]:
            self._drop(tenant)
        return head
