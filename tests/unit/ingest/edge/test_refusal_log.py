"""The log of refused requests: which statuses, what a line says, and its budget."""

from __future__ import annotations

import asyncio
import logging

import pytest
from starlette.types import Message, Receive, Scope, Send

from ingest.edge.refusal_log import (
    BURST_LINES,
    LINES_PER_S,
    LogBudget,
    RefusalLog,
    client_address,
    refusal_line,
)


def scope(path: str = "/v1/infer", client: tuple[str, int] | None = ("203.0.113.7", 5555)) -> Scope:
    return {"type": "http", "method": "POST", "path": path, "client": client}


def test_a_burst_is_written_then_left_out_then_counted_when_the_budget_refills() -> None:
    budget = LogBudget(rate_per_s=10, burst=3)
    assert [budget.take(0.0) for _ in range(3)] == [0, 0, 0]
    assert [budget.take(0.0) for _ in range(5)] == [None] * 5
    # 0.1 s later: one token back, and the line says five were left out.
    assert budget.take(0.1) == 5
    assert budget.take(0.1) is None
    assert budget.take(0.2) == 1


def test_the_budget_never_holds_more_than_its_burst() -> None:
    budget = LogBudget(rate_per_s=LINES_PER_S, burst=BURST_LINES)
    budget.take(0.0)
    taken = [budget.take(3600.0) for _ in range(int(BURST_LINES) + 5)]
    assert taken.count(None) == 5


def test_a_line_names_status_method_path_and_address() -> None:
    line = refusal_line(scope(), 401, 0)
    assert line == "refused 401 POST '/v1/infer' from 203.0.113.7"
    assert "12 earlier refusals not logged" in refusal_line(scope(), 429, 12)


def test_a_hostile_path_cannot_forge_a_line() -> None:
    line = refusal_line(scope(path="/x\nrefused 401 GET '/' from 10.0.0.1" + "a" * 500), 401, 0)
    assert "\n" not in line and len(line) < 200


def test_no_client_in_the_scope_is_said_plainly() -> None:
    assert client_address(scope(client=None)) == "unknown"


def run(status: int, caplog: pytest.LogCaptureFixture) -> list[str]:
    async def app(s: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ingest.edge.refusal_log"):
        asyncio.run(RefusalLog(app, clock=lambda: 0.0)(scope(), receive, send))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    return [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("status", [401, 403, 408, 413, 429])
def test_refusals_about_the_caller_are_logged(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    assert run(status, caplog) == [f"refused {status} POST '/v1/infer' from 203.0.113.7"]


@pytest.mark.parametrize("status", [200, 202, 400, 404, 422, 500, 503])
def test_other_answers_are_not(status: int, caplog: pytest.LogCaptureFixture) -> None:
    assert run(status, caplog) == []
