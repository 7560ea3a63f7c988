"""The event loop's stalls, named (ingest/operations/stalls.py)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from ingest.operations.stalls import StallWatch


def a_blocking_call_in_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # what a handler doing blocking I/O on the loop does


def test_a_stall_is_logged_with_what_held_the_loop(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> StallWatch:
        watch = StallWatch(threshold_ms=50)
        task = asyncio.create_task(watch.run())
        await asyncio.sleep(0.05)
        a_blocking_call_in_the_loop(0.3)
        await asyncio.sleep(0.05)
        task.cancel()
        return watch

    with caplog.at_level(logging.WARNING, logger="ingest.operations.stalls"):
        watch = asyncio.run(scenario())
    assert len(watch.stalls) == 1
    ms, frames = watch.stalls[0]
    assert 200 < ms < 1000
    assert "a_blocking_call_in_the_loop" in frames
    assert "a_blocking_call_in_the_loop" in caplog.text


def test_a_loop_that_keeps_up_logs_nothing() -> None:
    async def scenario() -> StallWatch:
        watch = StallWatch(threshold_ms=100)
        task = asyncio.create_task(watch.run())
        for _ in range(20):
            time.sleep(0.005)  # short callbacks: the loop comes round in time
            await asyncio.sleep(0.005)
        task.cancel()
        return watch

    assert asyncio.run(scenario()).stalls == []
