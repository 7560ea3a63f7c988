"""What to do with a batch that failed. Pure.

A failed batch (model error, crashed or hung worker) is split in halves until
the bad input is alone, so one poison input cannot fail its neighbours. A lone
input is retried with exponential backoff and jitter, and recorded as failed
once it has used its attempts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from scheduler.core.batcher import Pending


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    base_delay_s: float = 0.2
    max_delay_s: float = 5.0

    def delay_s(self, attempt: int, rng: random.Random | None = None) -> float:
        """Full-jitter exponential backoff for the ``attempt``-th retry (1-based)."""
        cap = min(self.max_delay_s, self.base_delay_s * (2 ** (attempt - 1)))
        return (rng or random).uniform(0, cap)


@dataclass
class FailurePlan:
    retry_groups: list[list[Pending]]  # run again, each group as its own batch
    retry_delay_s: float  # wait before the retry (0 for a split)
    failed: list[Pending]  # out of attempts: record as failed


def plan_failure(
    items: list[Pending], policy: RetryPolicy, rng: random.Random | None = None
) -> FailurePlan:
    if len(items) > 1:
        mid = len(items) // 2
        return FailurePlan([items[:mid], items[mid:]], 0.0, [])
    (p,) = items
    p.msg.attempt += 1
    if p.msg.attempt >= policy.max_attempts:
        return FailurePlan([], 0.0, [p])
    return FailurePlan([[p]], policy.delay_s(p.msg.attempt, rng), [])
