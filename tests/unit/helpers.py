"""Builders for unit tests of the scheduler's pure policy."""

from __future__ import annotations

import itertools

from core.messages import RequestMessage
from scheduler.core.batcher import BatchKey, Pending

_ids = itertools.count()


def pending(
    *,
    key: BatchKey | None = None,
    rank: int = 0,
    at: float = 0.0,
    deadline: float = 100.0,
    tp: tuple[str, int] = ("t", 0),
    offset: int | None = None,
    input_: str | None = None,
) -> Pending:
    n = next(_ids)
    key = key or BatchKey("sim", "1")
    msg = RequestMessage(
        request_id=f"r{n}",
        tenant_id="t1",
        priority="paid",
        model=key.model,
        version=key.version,
        input=input_ or f"in{n}",
        params=dict(key.params),
        deadline=deadline,
        received_at=at,
    )
    return Pending(
        msg=msg, key=key, rank=rank, tp=tp, offset=n if offset is None else offset, consumed_at=at
    )
