"""Job request bodies. As for ``/v1/infer`` (ingest/schemas.py): malformed JSON is
400, a body of the wrong shape 422, a value we cannot take (a NUL, a string over its
cap, an input the model refuses) 400; every error names the field.

Caps on free-form values (custom_id, metadata) are constants documented here and in
the API reference; item inputs are capped by the model (``max_input_chars``).
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core.errors import InvalidInput, SchemaViolation

MAX_CUSTOM_ID = 255  # characters
# Metadata is a label set for the tenant's own bookkeeping, with OpenAI's batch limits:
# at most 16 pairs, keys of at most 64 and values of at most 512 characters.
METADATA_MAX_PAIRS = 16
METADATA_MAX_KEY = 64
METADATA_MAX_VALUE = 512
# Item indexes and page cursors are PostgreSQL int4.
MAX_INDEX = 2**31 - 1


class JobOptions(BaseModel):
    """What applies to every item: in a JSON body, or the query of a JSONL upload."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(min_length=1, max_length=200)
    params: dict[str, Any] | None = None
    completion_window_s: int | None = None
    webhook_url: str | None = None


class JobItem(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    custom_id: str | None = None
    input: Any = Field()  # required: any JSON value the model validates


class JobBody(JobOptions):
    """``POST /v1/jobs`` with ``Content-Type: application/json``. ``items`` are checked
    one by one (``JobItem``) so a huge list of bad items stops at the first."""

    items: list[Any]
    metadata: dict[str, str] | None = None


T = TypeVar("T", bound=BaseModel)
_INDEX = re.compile(r"[0-9]+")


def validate(data: Any, schema: type[T], where: str = "") -> T:
    """``data`` as ``schema``, or a 422 naming the field (``where`` prefixes it)."""
    if not isinstance(data, dict):
        raise InvalidInput(f"{where or 'request body'} must be a JSON object", field=where or None)
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = where
        for part in err["loc"]:
            loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
        loc = loc or "body"
        msg = "field is required" if err["type"] == "missing" else err["msg"]
        raise SchemaViolation(f"{loc}: {msg}", field=loc) from exc


def nul_path(value: Any, path: str) -> str | None:
    """The field under ``path`` holding a NUL character (in a string or a key), if any:
    PostgreSQL's text and JSONB cannot store one. (To move to the shared validation
    module at the edge once it exists.)"""
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, dict):
        for k, v in value.items():
            if "\x00" in k:
                return path
            found = nul_path(v, f"{path}.{k}")
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = nul_path(v, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def refuse_nul(value: Any, path: str) -> None:
    found = nul_path(value, path)
    if found is not None:
        raise InvalidInput(f"{found} contains a NUL character (U+0000)", field=found)


def check_custom_id(custom_id: str | None, where: str) -> None:
    if custom_id is None:
        return
    field = f"{where}.custom_id"
    if len(custom_id) > MAX_CUSTOM_ID:
        raise InvalidInput(
            f"{field} may be at most {MAX_CUSTOM_ID} characters", field=field
        )
    refuse_nul(custom_id, field)


def check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > METADATA_MAX_PAIRS:
        raise InvalidInput(
            f"metadata may hold at most {METADATA_MAX_PAIRS} pairs", field="metadata"
        )
    for k, v in metadata.items():
        if len(k) > METADATA_MAX_KEY:
            raise InvalidInput(
                f"metadata keys may be at most {METADATA_MAX_KEY} characters", field="metadata"
            )
        if len(v) > METADATA_MAX_VALUE:
            raise InvalidInput(
                f"metadata.{k} may be at most {METADATA_MAX_VALUE} characters",
                field=f"metadata.{k}",
            )
    refuse_nul(metadata, "metadata")


def parse_index(raw: str | None, name: str, *, default: int, low: int, high: int) -> int:
    """A page cursor or size from the query string: decimal digits only, within
    ``low..high``; anything else is a 400 naming ``name`` (never a database error)."""
    if raw is None:
        return default
    if not _INDEX.fullmatch(raw) or len(raw) > 10 or not low <= int(raw) <= high:
        raise InvalidInput(f"{name} must be an integer from {low} to {high}", field=name)
    return int(raw)
