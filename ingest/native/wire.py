"""``POST /v1/infer`` on the wire: its body, parsed so each failure gets the right status
(malformed JSON 400, a schema violation 422, a value the service cannot carry or that
breaks a documented cap 400, each naming the field; caps: settings.EdgeSettings,
checks: core/limits.py), and the answers built from a finished request's row. Pure."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from core.config import Settings
from core.limits import check_int, check_json, check_object, check_text
from core.models.spec import ModelSpec
from ingest.acceptance.inputs import raise_if_unsuccessful
from ingest.edge.bodies import parse_body
from results.requests import AnswerRow
from results.vectors import EncodingFormat, answer_output


class InferBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(min_length=1, description="'name' (its latest live version) or 'name@v'")
    input: Any = Field(description="the model's input; text models take a non-empty string")
    params: dict[str, Any] | None = Field(default=None, description="the model's parameters")
    timeout_ms: int | None = Field(
        default=None, gt=0, description="deadline (ms); default: the tier's SLO"
    )
    service_tier: Any = Field(
        default=None,
        description="'flex' (queued behind sync work, never refused for capacity; 202 with "
        "Location when not done in time), 'default' or 'priority' (decision 66)",
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
    service_tier: str = "default"  # what it was served as (decision 66)


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
            "service_tier": {
                "type": "string",
                "enum": ["flex", "default", "priority"],
                "description": InferBody.model_fields["service_tier"].description,
            },
        },
    }


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


def accept(spec: ModelSpec, body: InferBody) -> dict[str, Any]:
    """The model's own checks on a parsed body; returns the normalized params."""
    spec.validate_input(body.input)
    return spec.normalize_params(body.params)


def _ms(a: datetime | None, b: datetime | None) -> float | None:
    return None if a is None or b is None else round((b - a).total_seconds() * 1000, 3)


def result_body(row: AnswerRow, total_ms: float | None = None) -> dict[str, Any]:
    """The answer for a finished request; raises the error for a failed or expired one.
    ``total_ms``: from when this call arrived (else from the request's own times)."""
    raise_if_unsuccessful(row)
    if total_ms is None:
        total_ms = _ms(row["received_at"], row["persisted_at"])
    return {
        "request_id": str(row["request_id"]),
        "output": answer_output(row["output"], row.get("output_vector"), EncodingFormat.FLOAT),
        "model": row["model"],
        "model_version": row["model_version"],
        "batch_size": row["batch_size"],
        "timings": {
            "queue_ms": _ms(row["received_at"], row["consumed_at"]),
            "batch_wait_ms": _ms(row["consumed_at"], row["batched_at"]),
            "compute_ms": _ms(row["compute_start_at"], row["compute_end_at"]),
            "persist_ms": _ms(row["compute_end_at"], row["persisted_at"]),
            "total_ms": round(total_ms, 3) if total_ms is not None else None,
        },
    }
