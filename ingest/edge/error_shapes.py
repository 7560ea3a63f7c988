"""The body an error answers with, in the shape the route's clients read. Pure.

One mapping decides the status (ingest/edge/http.py); this module only writes the body:

* Gristmill's own routes: ``{"error": {"code", "message", "field"?, "reference"?}}``.
* OpenAI-compatible routes (``/v1/embeddings``, ``/v1/completions`` and
  ``/v1/completions/{id}``, everything under ``/v1/files`` and ``/v1/batches``):
  ``{"error": {"message", "type", "param", "code"}}``, as OpenAI's API and SDK
  expect; ``type`` is OpenAI's class of the status, ``code`` Gristmill's own code,
  ``param`` the field at fault.
* KServe v2 / Triton routes (``/v2``): ``{"error": "<message>"}`` (the Open
  Inference Protocol's error body; tritonclient raises it as its message).

The route's path picks the shape (``shape_for``), so every answer on a path has
it: the key check before the route, a validation error, an unknown path, a bug.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from core.errors import GristmillError


class Shape(StrEnum):
    GRISTMILL = "gristmill"
    OPENAI = "openai"
    KSERVE = "kserve"


# Paths served for OpenAI's clients (templates: ``{name}`` is one path segment) and
# KServe's (prefix).
OPENAI_PATHS = frozenset(
    {
        "/v1/embeddings",
        "/v1/embeddings/{request_id}",
        "/v1/completions",
        "/v1/completions/{completion_id}",
    }
)
OPENAI_PREFIXES = ("/v1/files", "/v1/batches")  # and every path under them
KSERVE_PREFIX = "/v2"


def matches(template: str, path: str) -> bool:
    """Whether ``path`` is ``template`` with each ``{name}`` one non-empty segment."""
    want, got = template.split("/"), path.split("/")
    return len(want) == len(got) and all(
        (w.startswith("{") and w.endswith("}") and g != "") or w == g
        for w, g in zip(want, got, strict=True)
    )


def shape_for(path: str) -> Shape:
    if any(matches(t, path) for t in OPENAI_PATHS):
        return Shape.OPENAI
    if any(path == p or path.startswith(p + "/") for p in OPENAI_PREFIXES):
        return Shape.OPENAI
    if path == KSERVE_PREFIX or path.startswith(KSERVE_PREFIX + "/"):
        return Shape.KSERVE
    return Shape.GRISTMILL


# OpenAI's error ``type`` for each status (its API reference's error codes).
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


def openai_type(status: int) -> str:
    return _OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def body(
    shape: Shape,
    status: int,
    code: str,
    message: str,
    *,
    field: str | None = None,
    reference: str | None = None,
) -> dict[str, object]:
    """An error's body in ``shape``."""
    if shape is Shape.KSERVE:
        return {"error": message}
    if shape is Shape.OPENAI:
        return {
            "error": {
                "message": message,
                "type": openai_type(status),
                "param": field,
                "code": code,
            }
        }
    detail: dict[str, object] = {"code": code, "message": message}
    if field is not None:
        detail["field"] = field
    if reference is not None:
        detail["reference"] = reference
    return {"error": detail}


def error_body(err: GristmillError, shape: Shape) -> dict[str, object]:
    if shape is Shape.GRISTMILL:
        return err.to_body()  # the error's own rendering (it may carry more)
    return body(shape, err.status, err.code, err.message, field=err.field)


# --- the shapes as OpenAPI declares them --------------------------------------------------


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str = Field(description="OpenAI's class of the status")
    param: str | None = Field(description="the request field at fault")
    code: str | None = Field(description="Gristmill's error code")


class OpenAIError(BaseModel):
    error: OpenAIErrorDetail


class KServeError(BaseModel):
    error: str


_WHEN = {
    400: "invalid input; the message names the field",
    401: "missing, malformed, unknown or revoked API key",
    403: "not yours, or a quota of stored files is full",
    404: "unknown model, version or route",
    405: "method not allowed",
    408: "the request body stopped arriving",
    413: "body larger than the cap",
    422: "missing field, Idempotency-Key reused with another body, model failed",
    429: "over the tenant's rate (Retry-After)",
    500: "a bug; the message quotes the reference in the server's log",
    503: "overloaded, not ready or a dependency down (Retry-After)",
    504: "the deadline passed; the inputs stay accepted",
}


def declared(shape: Shape, statuses: tuple[int, ...] = tuple(_WHEN)) -> dict[int | str, Any]:
    """The error answers of a route in ``shape``, for FastAPI's ``responses``."""
    model = OpenAIError if shape is Shape.OPENAI else KServeError
    return {s: {"model": model, "description": _WHEN[s]} for s in statuses}


# --- Gristmill's own shape ---------------------------------------------------------------


class ErrorDetail(BaseModel):
    code: str
    message: str
    field: str | None = Field(default=None, description="the request field at fault")
    reference: str | None = Field(default=None, description="a 500's id in the server's log")


class ErrorBody(BaseModel):
    error: ErrorDetail


def _err(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


# Every answer an API route can give besides its success (README "The API").
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _err("invalid input; error.field names it"),
    401: _err("missing, malformed, unknown or revoked API key"),
    403: _err("not yours"),
    404: _err("unknown model, version, request or job"),
    408: _err("the request body stopped arriving"),
    413: _err("body larger than the cap"),
    422: _err("schema violation, Idempotency-Key reused with another body, model failed"),
    429: _err("over the tenant's rate (Retry-After)"),
    500: _err("a bug; error.reference finds it in the server's log"),
    503: _err("overloaded or a dependency down (Retry-After)"),
    504: _err("the deadline passed; the request stays accepted"),
}
