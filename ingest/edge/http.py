"""HTTP plumbing: the one place errors become status codes, and the body's limits.

* A ``GristmillError`` answers with its own status and body.
* A database error is classified by its SQLSTATE: the database being away, busy or
  restarting is 503 with Retry-After; a value it refuses (data exception, constraint,
  a program limit such as an index entry too large) is the client's mistake, 400;
  anything else is a bug.
* A bug is a JSON 500 carrying a reference id, logged once with its stack under that
  id; the body never holds the exception's text. ``ErrorGuard`` (outermost) makes
  sure of it for everything inside: the fast path, middleware, FastAPI, a stream
  that fails after its first bytes (which can only be logged and cut short). No
  request writes more than a bounded amount of log: a stack is cut to
  ``TRACE_MAX_CHARS`` (a recursion's repeats would be ~165 KB) and stacks are drawn
  from a budget; past it a bug is logged as one line with its reference.
See docs/decisions/0025-edge-validation-caps-and-error-mapping.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import traceback
import uuid

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import (
    DBAPIError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
    StatementError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.errors import (
    GristmillError,
    InvalidInput,
    PayloadTooLarge,
    RequestTimeout,
    SchemaViolation,
    Unavailable,
)
from core.limits import shown
from ingest.edge.error_shapes import Shape, error_body, shape_for
from ingest.edge.error_shapes import body as shaped_body
from ingest.edge.json_response import ORJSONResponse
from ingest.edge.refusal_counts import note_refusal
from ingest.edge.refusal_log import LogBudget

log = logging.getLogger(__name__)

# Set on an exception once it was logged as a bug, so it is logged once.
_REFERENCE = "_gristmill_reference"
# The most of one stack a log line holds: its start (where it entered our code) and its
# end (what raised), the middle left out.
TRACE_MAX_CHARS = 8_000
# Stacks logged per second per process, and the burst; past it, one line per bug.
_TRACES = LogBudget(rate_per_s=1.0, burst=10.0)


def bounded_trace(exc: BaseException, max_chars: int = TRACE_MAX_CHARS) -> str:
    """``exc``'s traceback, at most ``max_chars`` (a quarter from its start, the rest
    from its end, saying how much was left out)."""
    text = "".join(traceback.format_exception(exc)).rstrip()
    if len(text) <= max_chars:
        return text
    head, tail = max_chars // 4, max_chars - max_chars // 4
    return f"{text[:head]}\n... {len(text) - head - tail} characters left out ...\n{text[-tail:]}"


def error_response(err: GristmillError, shape: Shape = Shape.GRISTMILL) -> ORJSONResponse:
    """``err``'s answer; ``shape``: the body its route's clients read (error_shapes.py)."""
    note_refusal(err)  # the request log's refusal counts (ingest/edge/refusal_counts.py)
    headers = dict(err.headers)
    if err.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(err.retry_after_s)))
    return ORJSONResponse(error_body(err, shape), status_code=err.status, headers=headers)


# SQLSTATE classes (the first two characters). The database is away, short of
# resources, restarting, cancelling on a timeout or asking for a retry: 503.
_UNAVAILABLE_CLASSES = frozenset({"08", "40", "53", "55", "57", "58"})
# A value it will not take: the request's, since the edge stores nothing else. 400.
_REFUSED = {
    "22": "a value in the request cannot be stored",
    "23": "the request conflicts with stored data",
    "54": "a value in the request is too large to store",
}
_REFUSED_STATES = {
    "22001": "a string in the request is too long to store",
    "22003": "a number in the request is out of range",
    "22021": "a string in the request holds a character that cannot be stored",
    "22P02": "a value in the request has an invalid format",
    "22P05": "a string in the request holds a character that cannot be stored",
}


# What may come from the database (or the way to it); ``database_error`` says what
# each one means for the client.
DATABASE_ERRORS: tuple[type[Exception], ...] = (SQLAlchemyError, psycopg.Error, OSError)


def database_error(exc: BaseException) -> GristmillError | None:
    """What a database error means for the client; None for a bug of ours."""
    if isinstance(exc, PoolTimeout):  # every pooled connection busy
        return Unavailable("the database is busy; retry shortly", retry_after_s=1)
    orig: BaseException = exc
    if isinstance(exc, StatementError) and exc.orig is not None:
        orig = exc.orig
    if isinstance(orig, UnicodeError):  # a string the driver cannot encode
        return InvalidInput("a string in the request is not valid Unicode")
    if isinstance(orig, psycopg.Error):
        state = orig.sqlstate or ""
        if not state:
            # Raised by the driver itself: NUL in text, a lost or refused connection.
            if isinstance(orig, psycopg.DataError):
                return InvalidInput(_REFUSED_STATES["22021"])
            if isinstance(orig, psycopg.OperationalError | psycopg.InterfaceError):
                return Unavailable("the database is unavailable", retry_after_s=2)
            return None
        if state[:2] in _UNAVAILABLE_CLASSES:
            return Unavailable("the database is unavailable", retry_after_s=2)
        if state[:2] in _REFUSED:
            return InvalidInput(_REFUSED_STATES.get(state, _REFUSED[state[:2]]))
        return None
    if isinstance(orig, OSError) or isinstance(exc, OperationalError | InterfaceError):
        # Connection refused or reset before the driver knew, or a driver-level
        # operational failure without a server's SQLSTATE.
        return Unavailable("the database is unavailable", retry_after_s=2)
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return Unavailable("the database is unavailable", retry_after_s=2)
    return None


def known_error(exc: BaseException) -> GristmillError | None:
    """What an error a handler raised means for the client; None for a bug."""
    if isinstance(exc, GristmillError):
        return exc
    if isinstance(exc, DATABASE_ERRORS):
        err = database_error(exc)
        if err is not None and err.status >= 500:
            log.warning("database unavailable: %s", type(exc).__name__)
        return err
    return None


def exception_response(exc: BaseException, shape: Shape = Shape.GRISTMILL) -> ORJSONResponse | None:
    """The answer for an error a handler raised; None for a bug (see ``internal_error``)."""
    err = known_error(exc)
    return None if err is None else error_response(err, shape)


def bug_reference(exc: BaseException, where: str) -> str:
    """A bug's reference id: logged with its stack (within a budget) the first time."""
    ref: str | None = getattr(exc, _REFERENCE, None)
    if ref is None:
        ref = uuid.uuid4().hex
        if _TRACES.take(time.monotonic()) is None:
            log.error(
                "internal error %s in %s: %s (stack not logged: over budget)",
                ref,
                where,
                type(exc).__name__,
            )
        else:
            log.error("internal error %s in %s\n%s", ref, where, bounded_trace(exc))
        with contextlib.suppress(AttributeError):  # a type without a __dict__
            setattr(exc, _REFERENCE, ref)
    return ref


def internal_error(
    exc: BaseException, where: str, shape: Shape = Shape.GRISTMILL
) -> ORJSONResponse:
    """A bug: logged with its stack under a new reference id, answered as a JSON 500."""
    ref = bug_reference(exc, where)
    content = shaped_body(
        shape,
        500,
        "internal_error",
        f"internal error; quote reference {ref} when reporting it",
        reference=ref,
    )
    return ORJSONResponse(content, status_code=500)


def answer(exc: BaseException, where: str, shape: Shape = Shape.GRISTMILL) -> ORJSONResponse:
    """The one mapping: a known error's answer, else a bug's."""
    known = exception_response(exc, shape)
    return known if known is not None else internal_error(exc, where, shape)


def field_path(loc: tuple[object, ...] | list[object]) -> str:
    """A validation error's location as a field name; parts a client chose (unknown
    keys) are quoted and cut short."""
    parts = []
    for part in loc:
        text = str(part)
        parts.append(text if len(text) <= 64 and text.isprintable() else shown(text))
    return ".".join(parts) or "body"


def install_error_handlers(app: FastAPI) -> None:
    async def on_known(request: Request, exc: Exception) -> ORJSONResponse:
        # The scope's path, not request.url.path: rebuilding the URL drops a \r, \n or
        # \t from it (urllib's rule), and "/v1/embeddings/%0D" would lose its last
        # segment and with it the OpenAI error shape.
        path = request.scope["path"]
        return answer(exc, f"{request.method} {path}", shape_for(path))

    async def on_validation(request: Request, exc: Exception) -> ORJSONResponse:
        assert isinstance(exc, RequestValidationError)
        err = exc.errors()[0]
        loc = field_path(err["loc"][1:]) if len(err["loc"]) > 1 else field_path(err["loc"])
        return error_response(
            SchemaViolation(f"{loc}: {err['msg']}", field=loc), shape_for(request.scope["path"])
        )

    async def on_http(request: Request, exc: Exception) -> ORJSONResponse:
        # Starlette's own 404 (no route) and 405 (wrong method), in the path's error shape.
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return ORJSONResponse(
            shaped_body(shape_for(request.scope["path"]), exc.status_code, code, str(exc.detail)),
            status_code=exc.status_code,
            headers=exc.headers,
        )

    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(HTTPException, on_http)
    handled: tuple[type[Exception], ...] = (GristmillError, *DATABASE_ERRORS)
    for exc_type in handled:
        app.add_exception_handler(exc_type, on_known)
    # Anything else reaches Starlette's ServerErrorMiddleware: JSON, not its text page.
    app.add_exception_handler(Exception, on_known)


class ErrorGuard:
    """Outermost: whatever escapes the application becomes a JSON 500 (before the
    response started) or a logged, cut-short response (after); never a text page."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception as exc:
            where = f"{scope.get('method')} {scope.get('path')}"
            if not started:
                await answer(exc, where, shape_for(scope.get("path", "")))(scope, receive, send)
            elif getattr(exc, _REFERENCE, None) is None:
                internal_error(exc, f"{where} (response already under way)")


def too_large(max_bytes: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body exceeds {max_bytes} bytes")


def capped(receive: Receive, max_bytes: int) -> Receive:
    """``receive`` that raises PayloadTooLarge once the body streamed past ``max_bytes``."""
    seen = 0

    async def limited() -> Message:
        nonlocal seen
        msg = await receive()
        if msg["type"] == "http.request":
            seen += len(msg.get("body", b""))
            if seen > max_bytes:
                raise too_large(max_bytes)
        return msg

    return limited


def timed(receive: Receive, timeout_s: float) -> Receive:
    """``receive`` that raises RequestTimeout (408) when the body is not all there
    ``timeout_s`` after it was first asked for: a client that stops sending holds
    nothing long. Once the body is complete, waits (for a disconnect) are not timed."""
    loop = asyncio.get_running_loop()
    deadline: float | None = None
    complete = False

    async def bounded() -> Message:
        nonlocal deadline, complete
        if complete:
            return await receive()
        if deadline is None:
            deadline = loop.time() + timeout_s
        try:
            msg = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise RequestTimeout(
                f"the request body did not arrive within {timeout_s:g} s"
            ) from None
        if msg["type"] != "http.request" or not msg.get("more_body", False):
            complete = True
        return msg

    return bounded


def declared_too_large(scope: Scope, max_bytes: int) -> bool:
    for name, value in scope.get("headers", []):
        if name == b"content-length" and value.isdigit() and int(value) > max_bytes:
            return True
    return False


class BodyLimit:
    """413 before reading a body that is too large, declared or streamed; 408 for one
    that stops arriving."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float):
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Job and file uploads stream up to gigabytes and enforce their own limits as
        # they parse (ingest/jobs/upload.py body_chunks).
        path = scope.get("path", "")
        if scope["type"] != "http" or path.startswith("/v1/jobs") or path == "/v1/files":
            await self.app(scope, receive, send)
            return
        shape = shape_for(scope.get("path", ""))
        if declared_too_large(scope, self.max_bytes):
            await error_response(too_large(self.max_bytes), shape)(scope, receive, send)
            return
        try:
            await self.app(scope, timed(capped(receive, self.max_bytes), self.timeout_s), send)
        except (PayloadTooLarge, RequestTimeout) as exc:
            await error_response(exc, shape)(scope, receive, send)
