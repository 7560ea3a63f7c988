"""ingest/http.py: errors become status codes in one place; the body cap."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from sqlalchemy.exc import OperationalError

from core.errors import (
    DeadlineExceeded,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    Unavailable,
)
from ingest.http import capped, declared_too_large, error_response, exception_response


def _body(resp: object) -> dict[str, object]:
    return orjson.loads(resp.body)  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize(
    ("err", "status"),
    [
        (InvalidInput("bad", field="input"), 400),
        (NotFound("no such model"), 404),
        (PayloadTooLarge("big"), 413),
        (RateLimited("slow down", retry_after_s=0.2), 429),
        (Unavailable("later", retry_after_s=2.5), 503),
        (DeadlineExceeded("late"), 504),
    ],
)
def test_each_error_keeps_its_status_and_names_its_field(err: Exception, status: int) -> None:
    resp = exception_response(err)
    assert resp is not None and resp.status_code == status
    body = _body(resp)["error"]
    assert isinstance(body, dict) and body["message"] == str(err)
    if status == 400:
        assert body["field"] == "input"


def test_retry_after_is_whole_seconds_and_at_least_one() -> None:
    assert error_response(RateLimited("x", retry_after_s=0.2)).headers["Retry-After"] == "1"
    assert error_response(Unavailable("x", retry_after_s=2.5)).headers["Retry-After"] == "3"
    assert "Retry-After" not in error_response(NotFound("x")).headers


def test_an_unreachable_database_is_503_not_500() -> None:
    resp = exception_response(OperationalError("SELECT 1", {}, Exception("refused")))
    assert resp is not None and resp.status_code == 503
    assert resp.headers["Retry-After"] == "2"


def test_a_bug_is_not_mapped() -> None:
    assert exception_response(KeyError("x")) is None


def test_declared_length_over_the_cap() -> None:
    scope = {"headers": [(b"content-length", b"1001")]}
    assert declared_too_large(scope, 1000)
    assert not declared_too_large({"headers": [(b"content-length", b"1000")]}, 1000)
    assert not declared_too_large({"headers": []}, 1000)


def test_a_streamed_body_past_the_cap_raises_413() -> None:
    chunks = [b"x" * 600, b"x" * 600]

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": chunks.pop(0), "more_body": bool(chunks)}

    limited = capped(receive, 1000)

    async def read_all() -> None:
        await limited()
        await limited()

    with pytest.raises(PayloadTooLarge):
        asyncio.run(read_all())
