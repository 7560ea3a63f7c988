"""HTTP plumbing: the one place errors become status codes, and the body size cap."""

from __future__ import annotations

import logging
import math

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import ORJSONResponse
from sqlalchemy.exc import DBAPIError, OperationalError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.errors import GristmillError, PayloadTooLarge, SchemaViolation, Unavailable

log = logging.getLogger("gristmill.ingest")


def error_response(err: GristmillError) -> ORJSONResponse:
    headers = dict(err.headers)
    if err.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(err.retry_after_s)))
    return ORJSONResponse(err.to_body(), status_code=err.status, headers=headers)


# A database that cannot be reached is the service's trouble, not the client's: 503.
DATABASE_ERRORS: tuple[type[Exception], ...] = (
    OperationalError,
    DBAPIError,
    psycopg.OperationalError,
    OSError,
)


def exception_response(exc: Exception) -> ORJSONResponse | None:
    """The answer for an error a handler raised; None for a bug (a 500 elsewhere)."""
    if isinstance(exc, GristmillError):
        return error_response(exc)
    if isinstance(exc, DATABASE_ERRORS):
        log.warning("database unavailable: %s", exc)
        return error_response(Unavailable("the database is unavailable", retry_after_s=2))
    return None


def install_error_handlers(app: FastAPI) -> None:
    async def on_known(_: Request, exc: Exception) -> ORJSONResponse:
        response = exception_response(exc)
        assert response is not None
        return response

    async def on_validation(_: Request, exc: Exception) -> ORJSONResponse:
        assert isinstance(exc, RequestValidationError)
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"][1:]) or "body"
        return error_response(SchemaViolation(f"{loc}: {err['msg']}", field=loc))

    app.add_exception_handler(RequestValidationError, on_validation)
    known: tuple[type[Exception], ...] = (GristmillError, *DATABASE_ERRORS)
    for exc_type in known:
        app.add_exception_handler(exc_type, on_known)


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


def declared_too_large(scope: Scope, max_bytes: int) -> bool:
    for name, value in scope.get("headers", []):
        if name == b"content-length" and value.isdigit() and int(value) > max_bytes:
            return True
    return False


class BodyLimit:
    """413 before reading a body that is too large, declared or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Job uploads stream up to gigabytes and enforce their own limits as they parse.
        if scope["type"] != "http" or scope.get("path", "").startswith("/v1/jobs"):
            await self.app(scope, receive, send)
            return
        if declared_too_large(scope, self.max_bytes):
            await error_response(too_large(self.max_bytes))(scope, receive, send)
            return
        try:
            await self.app(scope, capped(receive, self.max_bytes), send)
        except PayloadTooLarge as exc:
            await error_response(exc)(scope, receive, send)
