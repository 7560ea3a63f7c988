"""Job request bodies. As for ``/v1/infer`` (ingest/native/wire.py): malformed JSON is
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
from core.limits import SHOWN_CHARS, check_json, check_text, shown

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
    # An incremental job (decision 61): a finished job of the tenant, same model and
    # version, whose results items with unchanged content reuse.
    base_job_id: str | None = None


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


def key_part(key: str) -> str:
    """A key the client chose, as a field path shows it: itself when short and
    printable, else quoted and cut short."""
    return key if key and len(key) <= SHOWN_CHARS and key.isprintable() else shown(key)


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
            if isinstance(part, int):
                loc += f"[{part}]"
                continue
            # A key the client chose (an unknown field) is quoted and cut short.
            name = (
                str(part)
                if len(str(part)) <= SHOWN_CHARS and str(part).isprintable()
                else shown(part)
            )
            loc += f".{name}" if loc else name
        loc = loc or "body"
        msg = "field is required" if err["type"] == "missing" else err["msg"]
        raise SchemaViolation(f"{loc}: {msg}", field=loc) from exc


def check_custom_id(custom_id: str | None, where: str) -> None:
    if custom_id is not None:
        check_text(custom_id, f"{where}.custom_id", max_chars=MAX_CUSTOM_ID)


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
                f"metadata.{key_part(k)} may be at most {METADATA_MAX_VALUE} characters",
                field=f"metadata.{key_part(k)}",
            )
    check_json(metadata, "metadata", max_depth=1)  # NUL, surrogates, in keys and values


def parse_index(raw: str | None, name: str, *, default: int, low: int, high: int) -> int:
    """A page cursor or size from the query string: decimal digits only, within
    ``low..high``; anything else is a 400 naming ``name`` (never a database error)."""
    if raw is None:
        return default
    if not _INDEX.fullmatch(raw) or len(raw) > 10 or not low <= int(raw) <= high:
        raise InvalidInput(f"{name} must be an integer from {low} to {high}", field=name)
    return int(raw)
