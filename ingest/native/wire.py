"""Request and response bodies. Parsing is explicit so each failure gets the right
status: malformed JSON is 400, a schema violation is 422, a value the service
cannot carry or that breaks a documented cap is 400, each naming the field
(caps: settings.EdgeSettings, checks: core/limits.py)."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.config import Settings
from core.errors import InvalidInput, SchemaViolation
from core.limits import check_int, check_json, check_object, check_text
from ingest.edge.http import field_path


class InferBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(min_length=1, description="'name' (its latest live version) or 'name@v'")
    input: Any = Field(description="the model's input; text models take a non-empty string")
    params: dict[str, Any] | None = Field(default=None, description="the model's parameters")
    timeout_ms: int | None = Field(
        default=None, gt=0, description="deadline (ms); default: the tier's SLO"
    )


class Timings(BaseModel):
    queue_ms: float | None
    batch_wait_ms: float | None
    compute_ms: float | None
    persist_ms: float | None
    total_ms: float | None


class InferAnswer(BaseModel):
    request_id: str
    output: Any
    model: str
    model_version: str
    batch_size: int | None
    timings: Timings


class RequestRecord(BaseModel):
    """``GET /v1/requests/{id}``: a finished request (the answer fields when succeeded)."""

    status: str
    error: str | None
    request_id: str | None = None
    output: Any = None
    model: str | None = None
    model_version: str | None = None
    batch_size: int | None = None
    timings: Timings | None = None


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


def infer_request_schema(settings: Settings, models: list[str]) -> dict[str, Any]:
    """``POST /v1/infer``'s body as OpenAPI declares it, with the caps in force."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["model", "input"],
        "properties": {
            "model": {
                # The served references; any other string is answered 404.
                "type": "string",
                "enum": models,
                "description": InferBody.model_fields["model"].description,
            },
            "input": {
                "type": "string",
                "minLength": 1,
                "maxLength": settings.max_input_chars,
                "description": InferBody.model_fields["input"].description,
            },
            "params": {
                "type": "object",
                "description": f"the model's parameters (at most {settings.max_params_bytes} "
                "bytes as JSON; see GET /v1/models)",
            },
            "timeout_ms": {
                "type": "integer",
                "minimum": settings.min_timeout_ms,
                "maximum": settings.max_timeout_ms,
            },
        },
    }


T = TypeVar("T", bound=BaseModel)


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body that must be one JSON object, or a 400 saying what it is instead."""
    if not raw.strip():
        raise InvalidInput("request body is empty; expected a JSON object")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidInput("request body must be a JSON object")
    return data


def parse_body(raw: bytes, schema: type[T]) -> T:
    data = json_object(raw)
    if "input" in schema.model_fields and "input" not in data:
        raise SchemaViolation("field 'input' is required", field="input")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = field_path(err["loc"])
        raise SchemaViolation(f"{loc}: {err['msg']}", field=loc) from exc


def check_infer_body(body: InferBody, settings: Settings) -> None:
    """The caps and what Kafka and PostgreSQL can carry, before any model looks at it.
    A string input is the model spec's to check (its own length cap comes first)."""
    check_text(body.model, "model", max_chars=settings.max_model_chars)
    if body.params is not None:
        check_object(
            body.params,
            "params",
            max_bytes=settings.max_params_bytes,
            max_depth=settings.max_json_depth,
        )
    if body.timeout_ms is not None:
        check_int(
            body.timeout_ms, "timeout_ms", lo=settings.min_timeout_ms, hi=settings.max_timeout_ms
        )
    if not isinstance(body.input, str):
        check_json(body.input, "input", max_depth=settings.max_json_depth)


def parse_infer(raw: bytes, settings: Settings) -> InferBody:
    body = parse_body(raw, InferBody)
    check_infer_body(body, settings)
    return body
