"""Request and response bodies. Parsing is explicit so each failure gets the right
status: malformed JSON is 400, a schema violation is 422, both naming the field."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.errors import InvalidInput, SchemaViolation


class InferBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(min_length=1, max_length=200)
    input: Any
    params: dict[str, Any] | None = None
    timeout_ms: int | None = Field(default=None, gt=0)


T = TypeVar("T", bound=BaseModel)


def parse_body(raw: bytes, schema: type[T]) -> T:
    if not raw.strip():
        raise InvalidInput("request body is empty; expected a JSON object")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidInput("request body must be a JSON object")
    if "input" in schema.model_fields and "input" not in data:
        raise SchemaViolation("field 'input' is required", field="input")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"]) or "body"
        raise SchemaViolation(f"{loc}: {err['msg']}", field=loc) from exc
