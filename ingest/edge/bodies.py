"""A JSON request body: one object, or a 400 saying what it is instead; a schema
violation 422 naming the field."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from core.errors import InvalidInput, SchemaViolation
from ingest.edge.http import field_path

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
