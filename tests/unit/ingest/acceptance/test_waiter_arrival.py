"""ingest/acceptance/waiters.py: a delivered row carries when it reached this instance, which is
where the overload guard's answer delay starts (not the transaction's start, so a slow
commit is not taken for the API's own saturation; decision 39)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import orjson

from ingest.acceptance.waiters import ARRIVED_AT, ResultWaiter


def payload(request_id: str, persisted_at: datetime) -> str:
    at = persisted_at.timestamp()
    row = {
        "request_id": request_id,
        "status": "succeeded",
        "error": None,
        "model": "sim",
        "model_version": "1",
        "batch_size": 1,
        "received_at": at - 1,
        "consumed_at": at - 0.9,
        "batched_at": at - 0.8,
        "compute_start_at": at - 0.7,
        "compute_end_at": at - 0.6,
        "persisted_at": at,
        "output": "x",
    }
    return orjson.dumps({"results": [row], "ids": []}).decode()


def test_an_announced_row_carries_its_arrival_and_the_database_is_told() -> None:
    async def run() -> None:
        waiter = ResultWaiter(None, "postgresql://u@h/db", poll_interval_s=1.0)  # type: ignore[arg-type]
        heard: list[float] = []
        waiter.on_heard = heard.append
        waiter.listening.set()
        fut = waiter.register("r1")
        # Committed three seconds after its transaction began (a checkpoint).
        slow_commit = datetime.now(UTC) - timedelta(seconds=3)
        t0 = time.time()
        waiter._hear(payload("r1", slow_commit))
        row = await fut
        assert t0 <= row[ARRIVED_AT] <= time.time()
        assert row[ARRIVED_AT] - row["persisted_at"].timestamp() > 2.9
        assert len(heard) == 1

    asyncio.run(run())
