"""ingest/acceptance/waiters.py without a database: callers sharing one request's future, and
announcements the listener cannot read.

The hammer reproduces the shared-future race: a retry (same Idempotency-Key) waits in
the process where the first attempt waits; the first gives up (its deadline) and lets
go; the answer then comes. The retry must get it, every time, in any interleaving."""

from __future__ import annotations

import asyncio
import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ingest.acceptance import waiters
from ingest.acceptance.waiters import ResultWaiter, received_window
from results import announce
from tests.unit.json_strategies import json_values

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def waiter() -> ResultWaiter:
    w = ResultWaiter(None, "postgresql://u@h/db", poll_interval_s=3600)  # type: ignore[arg-type]
    w.listening.set()  # as if LISTEN were up; nothing here talks to a database
    return w


def row(rid: str) -> dict[str, Any]:
    return {
        "request_id": rid,
        "status": "succeeded",
        "error": None,
        "model": "sim",
        "model_version": "1",
        "batch_size": 1,
        "received_at": T0,
        "consumed_at": T0 + timedelta(milliseconds=1),
        "batched_at": T0,
        "compute_start_at": T0,
        "compute_end_at": T0,
    }


def payload(*rids: str) -> str:
    answers = announce.Answers(T0)
    out = [answers.answer(row(r), f'{{"n": {i}}}', None) for i, r in enumerate(rids)]
    [p] = announce.payloads(out, [])
    return p


async def _holder(w: ResultWaiter, rid: str, wait_s: float, got: dict[int, str], i: int) -> None:
    """One caller: registers, waits up to ``wait_s`` for the answer, lets go."""
    fut = w.register(rid)
    try:
        row = await asyncio.wait_for(asyncio.shield(fut), timeout=wait_s)
        got[i] = "answered" if row["request_id"] == rid else "wrong"
    except TimeoutError:
        got[i] = "504"
    finally:
        w.discard(rid)


def test_a_retry_gets_the_answer_after_the_first_attempt_gave_up() -> None:
    async def go() -> dict[int, str]:
        w = waiter()
        rid = str(uuid.uuid4())
        got: dict[int, str] = {}
        first = asyncio.create_task(_holder(w, rid, 0.01, got, 0))  # gives up first
        retry = asyncio.create_task(_holder(w, rid, 2.0, got, 1))
        await first
        w._hear(payload(rid))  # the answer comes after the first let go
        await retry
        return got

    got = asyncio.run(go())
    assert got == {0: "504", 1: "answered"}


def test_the_hammer_no_caller_that_waits_past_the_answer_gets_504() -> None:
    """Many requests at once, each with 1-4 callers that give up at random times and an
    answer at a random time; whoever still waits when the answer comes must get it."""

    async def go(seed: int) -> list[tuple[float, float, float, str]]:
        rng = random.Random(seed)
        w = waiter()
        outcomes: list[tuple[float, float, float, str]] = []
        tasks = []
        plans = []
        for _ in range(64):
            rid = str(uuid.uuid4())
            answer_at = rng.uniform(0.0, 0.05)
            callers = []
            for _ in range(rng.randint(1, 4)):
                start, patience = rng.uniform(0.0, 0.04), rng.choice([0.005, 0.02, 0.15])
                callers.append((start, patience))
            plans.append((rid, answer_at, callers))

        async def caller(rid: str, start: float, patience: float, answer_at: float) -> None:
            await asyncio.sleep(start)
            got: dict[int, str] = {}
            await _holder(w, rid, patience, got, 0)
            outcomes.append((start, start + patience, answer_at, got[0]))

        async def answer(rid: str, at: float) -> None:
            await asyncio.sleep(at)
            w._hear(payload(rid))

        for rid, answer_at, callers in plans:
            tasks.append(asyncio.create_task(answer(rid, answer_at)))
            for start, patience in callers:
                tasks.append(asyncio.create_task(caller(rid, start, patience, answer_at)))
        await asyncio.gather(*tasks)
        assert not w._waiting, "every caller let go, so nothing stays registered"
        return outcomes

    for seed in range(12):
        for start, gives_up, answer_at, outcome in asyncio.run(go(seed)):
            assert outcome != "wrong"
            # Registered before the answer and waiting well past it: answered. (Callers
            # that come after every holder let go fetch the row themselves, as retries do.)
            if start < answer_at - 0.005 and gives_up > answer_at + 0.01:
                assert outcome == "answered", (seed, gives_up, answer_at)


def test_holders_share_the_future_until_the_last_lets_go() -> None:
    async def go() -> None:
        w = waiter()
        rid = str(uuid.uuid4())
        a, b = w.register(rid), w.register(rid)
        assert a is b
        w._hear(payload(rid))
        assert a.done()
        c = w.register(rid)  # a caller after the answer finds it at once
        assert c is a and c.done()
        for _ in range(3):
            w.discard(rid)
        assert rid not in w._waiting
        w.discard(rid)  # one too many is harmless

    asyncio.run(go())


# --- announcements the listener cannot read ------------------------------------------


def test_an_out_of_range_time_is_fetched_by_id_and_the_listener_goes_on() -> None:
    async def go() -> None:
        w = waiter()
        good, bad = str(uuid.uuid4()), str(uuid.uuid4())
        fg, fb = w.register(good), w.register(bad)
        p = orjson.loads(payload(good, bad))
        p["results"][1]["received_at"] = 1e20  # the year 3 trillion
        w._hear(orjson.dumps(p).decode())
        assert fg.done() and not fb.done()
        assert w._heard == [bad]  # fetched by its id (the resolver's next query)

    asyncio.run(go())


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    text=st.text(max_size=200),
    junk=json_values,
    field=st.sampled_from([*announce.TIMES, "persisted_at", "output_vector", "request_id"]),
    value=json_values,
)
@example(text="", junk=None, field="received_at", value=1e300)
@example(text="{}", junk=[], field="consumed_at", value=-1e20)
@example(text="null", junk={"results": 1}, field="output_vector", value="!!")
def test_no_payload_stops_the_listener(text: str, junk: Any, field: str, value: Any) -> None:
    async def go() -> None:
        w = waiter()
        rid = str(uuid.uuid4())
        fut = w.register(rid)
        p = orjson.loads(payload(rid))
        p["results"][0][field] = value
        for note in (text, orjson.dumps(junk).decode(), orjson.dumps(p).decode()):
            w._hear(note)  # never raises: the listener's loop would end with it
        assert fut.done() or rid in w._heard or field == "request_id"

    asyncio.run(go())


def test_a_fetch_is_bounded_by_the_waiting_requests_receipt_times() -> None:
    """The request log is partitioned by received_at: a fetch names the window its ids
    were received in (a second's slack either side), so PostgreSQL looks in one
    partition instead of all of them; an id whose time is unknown widens it to all."""
    t = T0.timestamp()
    assert received_window([t + 5, t, t + 2]) == (
        T0 - timedelta(seconds=1),
        T0 + timedelta(seconds=6),
    )
    assert received_window([t, None]) is None
    assert received_window([]) is None


def test_the_waiter_fetches_within_the_window_of_what_it_registered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[Any] = []

    async def fetch(engine: Any, ids: list[str], received: Any = None) -> list[Any]:
        asked.append(received)
        return []

    monkeypatch.setattr(waiters, "fetch_answers", fetch)

    async def go() -> None:
        w = waiter()
        a, b, c = (str(uuid.uuid4()) for _ in range(3))
        w.register(a, T0.timestamp())
        w.register(b, T0.timestamp() + 3)
        w.register(c)  # no time known: a retry found by another process, say
        await w.fetch([a, b])
        await w.fetch([a, c])

    asyncio.run(go())
    assert asked == [(T0 - timedelta(seconds=1), T0 + timedelta(seconds=4)), None]
