"""ingest/edge/http.py: one mapping from errors to answers (bugs are JSON 500s with a reference);
the body's limits."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import psycopg
import psycopg.errors
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from sqlalchemy.exc import DBAPIError, OperationalError, StatementError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.types import Message, Receive, Scope, Send

from core.errors import (
    DeadlineExceeded,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    RequestTimeout,
    Unavailable,
)
from ingest.edge.http import (
    TRACE_MAX_CHARS,
    ErrorGuard,
    bounded_trace,
    capped,
    database_error,
    declared_too_large,
    error_response,
    exception_response,
    field_path,
    install_error_handlers,
    timed,
)


def wrapped(sqlstate: str) -> DBAPIError:
    orig = psycopg.errors.lookup(sqlstate)("server said something internal")
    return DBAPIError("SELECT secret_table", None, orig)


@pytest.mark.parametrize("sqlstate", ["22P05", "22P02", "22003", "22001", "23505", "54000"])
def test_values_the_database_refuses_are_400(sqlstate: str) -> None:
    err = database_error(wrapped(sqlstate))
    assert err is not None and err.status == 400
    assert "internal" not in err.message and "secret_table" not in err.message


@pytest.mark.parametrize(
    "sqlstate", ["08006", "40001", "40P01", "53300", "55P03", "57014", "57P01"]
)
def test_the_database_away_busy_or_restarting_is_503(sqlstate: str) -> None:
    err = database_error(wrapped(sqlstate))
    assert err is not None and err.status == 503 and err.retry_after_s


@pytest.mark.parametrize("sqlstate", ["42601", "42P01", "XX000", "25P02"])
def test_errors_that_are_our_bugs_are_not_mapped(sqlstate: str) -> None:
    assert database_error(wrapped(sqlstate)) is None


def test_driver_side_errors() -> None:
    nul = psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
    assert database_error(nul).status == 400  # type: ignore[union-attr]
    refused = psycopg.OperationalError("connection failed: Connection refused")
    assert database_error(DBAPIError("x", None, refused)).status == 503  # type: ignore[union-attr]
    enc = UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
    assert database_error(StatementError("x", "SELECT", None, enc)).status == 400  # type: ignore[union-attr]
    assert database_error(PoolTimeout("pool exhausted")).status == 503  # type: ignore[union-attr]
    assert database_error(ConnectionRefusedError()).status == 503  # type: ignore[union-attr]


def test_field_paths_quote_what_a_client_chose() -> None:
    assert field_path(("params", "salt")) == "params.salt"
    hostile = field_path(("body", "k" * 5000))
    assert len(hostile) < 80
    assert "\x00" not in field_path(("a\x00b",))


def app_with_routes() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/bug")
    async def bug() -> None:
        raise RuntimeError("password=hunter2 at /srv/secret.py")

    @app.get("/known")
    async def known() -> None:
        raise NotFound("no such thing", field="id")

    @app.get("/v1/embeddings/{request_id}")
    async def pending(request_id: str) -> None:
        raise InvalidInput("inputs is required", field="inputs")

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def lines() -> AsyncIterator[bytes]:
            yield b"first\n"
            raise RuntimeError("broke mid-stream")

        return StreamingResponse(lines())

    return app


def call(app: Any, path: str) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.get(path)

    return asyncio.run(go())


def test_a_bug_is_a_json_500_with_a_reference_logged_once_with_its_stack(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="ingest.edge.http"):
        r = call(ErrorGuard(app_with_routes()), "/bug")
    assert r.status_code == 500 and r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert err["code"] == "internal_error" and err["reference"] in err["message"]
    assert "hunter2" not in r.text and "secret.py" not in r.text
    logged = [rec for rec in caplog.records if err["reference"] in rec.getMessage()]
    assert len(logged) == 1 and "Traceback" in logged[0].getMessage()
    assert "RuntimeError" in logged[0].getMessage()


def test_no_bug_writes_more_than_a_bounded_log(caplog: pytest.LogCaptureFixture) -> None:
    def deep(n: int) -> None:
        deep(n + 1)

    app = app_with_routes()

    @app.get("/recursion")
    async def recursion() -> None:
        deep(0)  # RecursionError: a stack of ~1,000 frames, ~165 KB formatted

    with caplog.at_level(logging.ERROR, logger="gristmill.ingest"):
        for _ in range(50):
            r = call(ErrorGuard(app), "/recursion")
            assert r.status_code == 500
    written = [len(rec.getMessage()) for rec in caplog.records]
    assert len(written) == 50
    assert max(written) <= TRACE_MAX_CHARS + 200
    assert "RecursionError" in caplog.records[0].getMessage()
    # Past the budget (10 stacks at once, 1 a second) a bug is one short line.
    assert sum(written) < 11 * (TRACE_MAX_CHARS + 200) + 40 * 300, sum(written)


def test_a_long_trace_keeps_its_start_and_its_end() -> None:
    try:
        raise ValueError("the end " + "x" * 20_000)
    except ValueError as exc:
        text = bounded_trace(exc, 1_000)
    assert len(text) < 1_100 and text.startswith("Traceback") and "left out" in text
    assert text.endswith("x" * 100)


def test_known_errors_keep_their_status_and_field() -> None:
    r = call(ErrorGuard(app_with_routes()), "/known")
    assert r.status_code == 404 and r.json()["error"]["field"] == "id"


def test_an_id_of_a_carriage_return_keeps_its_routes_error_shape() -> None:
    # Found by the fuzzer: GET /v1/embeddings/%0D. Rebuilding the URL drops the \r, the
    # path lost its last segment and the error came in Gristmill's shape, not OpenAI's.
    messages = run_asgi(ErrorGuard(app_with_routes()), "/v1/embeddings/\r")
    body = orjson.loads(
        b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    )
    assert body["error"]["type"] == "invalid_request_error"


def test_unknown_routes_answer_in_the_error_shape() -> None:
    r = call(ErrorGuard(app_with_routes()), "/nowhere")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def run_asgi(app: Any, path: str) -> list[Message]:
    """The messages ``app`` sends for one GET, through no transport that judges them."""
    sent: list[Message] = []
    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("t", 80),
        "client": ("c", 1),
        "root_path": "",
    }

    async def receive() -> Message:
        await asyncio.sleep(3600)
        raise AssertionError

    async def send(msg: Message) -> None:
        sent.append(msg)

    asyncio.run(app(scope, receive, send))
    return sent


def test_a_stream_that_fails_is_logged_once_and_cut_short(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="ingest.edge.http"):
        sent = run_asgi(ErrorGuard(app_with_routes()), "/stream")
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    # The last chunk still says more is coming: the server then closes the connection
    # and the client sees a truncated body, never a second response.
    assert bodies and bodies[-1].get("more_body", False)
    assert sum(m["type"] == "http.response.start" for m in sent) == 1
    assert sum("internal error" in rec.getMessage() for rec in caplog.records) == 1


def test_the_guard_answers_for_bare_asgi_apps_too(caplog: pytest.LogCaptureFixture) -> None:
    async def broken(scope: Scope, receive: Receive, send: Send) -> None:
        raise ValueError("inside a middleware")

    async def refuses(scope: Scope, receive: Receive, send: Send) -> None:
        raise InvalidInput("bad value", field="x")

    with caplog.at_level(logging.ERROR, logger="ingest.edge.http"):
        r = call(ErrorGuard(broken), "/")
    assert r.status_code == 500 and "inside a middleware" not in r.text
    r = call(ErrorGuard(refuses), "/")
    assert r.status_code == 400 and r.json()["error"]["field"] == "x"


def test_a_body_that_stops_arriving_times_out_but_a_finished_one_is_not_timed() -> None:
    async def stalls() -> Message:
        await asyncio.sleep(3600)
        raise AssertionError

    async def go() -> None:
        receive = timed(stalls, 0.05)
        with pytest.raises(RequestTimeout):
            await receive()

        msgs = [{"type": "http.request", "body": b"x", "more_body": False}]

        async def then_waits() -> Message:
            if msgs:
                return msgs.pop()
            await asyncio.sleep(0.2)  # waiting for a disconnect: longer than the timeout
            return {"type": "http.disconnect"}

        receive = timed(then_waits, 0.05)
        assert (await receive())["body"] == b"x"
        assert (await receive())["type"] == "http.disconnect"

    asyncio.run(go())


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
