"""Partial answers of ``POST /v1/embeddings`` at the deadline (decision 63). Pure.

A caller that sends ``Prefer: partial-results`` and whose deadline passes with k of n
inputs done gets 200 with those k in ``data`` (each keeps its ``index``), so OpenAI's
SDK parses it as ever, plus what is missing: the ``partial`` field of the body and the
``Gristmill-Missing`` and ``Location`` headers. The rest keep running (their messages
carry ``keep_until``) and are stored under their own ids; ``GET`` of the Location, or
the same POST with the same Idempotency-Key, answers what is done by then.

The Location names the request by input 0's id (the others derive from it,
acceptance/pipeline.py ``item_request_id``), how many inputs it has, and the answer's
encoding, so the GET needs nothing stored beyond the inputs' own rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from core.errors import InvalidInput
from core.limits import shown
from ingest.acceptance.prefer import PARTIAL_RESULTS
from ingest.openai.wire import MAX_INPUTS, embeddings_answer
from results.vectors import EncodingFormat

MISSING_HEADER = "Gristmill-Missing"  # how many inputs a partial answer lacks


def rest_location(
    first_id: str, inputs: int, encoding: EncodingFormat, dimensions: int | None
) -> str:
    """Where the whole request's inputs are fetched, the rest as they finish."""
    query: dict[str, Any] = {"inputs": inputs}
    if encoding is not EncodingFormat.FLOAT:
        query["encoding_format"] = encoding.value
    if dimensions is not None:
        query["dimensions"] = dimensions
    return f"/v1/embeddings/{first_id}?{urlencode(query)}"


@dataclass(frozen=True)
class RestQuery:
    """A Location's query: how many inputs, and how to encode them."""

    inputs: int
    encoding: EncodingFormat = EncodingFormat.FLOAT
    dimensions: int | None = None


def _positive(params: Mapping[str, str], name: str, hi: int | None = None) -> int | None:
    raw = params.get(name)
    if raw is None:
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 9 or int(raw) < 1:
        raise InvalidInput(f"{name} must be a positive integer, got {shown(raw)}", field=name)
    if hi is not None and int(raw) > hi:
        raise InvalidInput(f"{name}={raw} is more than {hi}", field=name)
    return int(raw)


def parse_rest_query(params: Mapping[str, str]) -> RestQuery:
    """The query of a Location ``rest_location`` made; a bad value is a 400 naming it."""
    inputs = _positive(params, "inputs", hi=MAX_INPUTS)
    if inputs is None:
        raise InvalidInput(
            "inputs is required: the request's number of inputs (the Location has it)",
            field="inputs",
        )
    fmt = params.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise InvalidInput(
            f"encoding_format must be 'float' or 'base64', got {shown(fmt)}",
            field="encoding_format",
        )
    return RestQuery(inputs, EncodingFormat(fmt), _positive(params, "dimensions"))


def partial_answer(
    rows: Sequence[Mapping[str, Any] | None],
    *,
    model: str,
    encoding: EncodingFormat,
    dimensions: int | None,
    tokens: int | None,
    location: str,
) -> dict[str, Any]:
    """The answer for ``rows`` in input order (None: not finished yet): OpenAI's shape
    for those done, and, while any is missing, ``partial`` saying how many and where
    the rest are. ``tokens``: their ``usage`` (None where the inputs are not at hand,
    a GET of the Location: no ``usage``)."""
    body = embeddings_answer(
        rows, model=model, encoding=encoding, dimensions=dimensions, tokens=tokens or 0
    )
    if tokens is None:
        del body["usage"]
    missing = missing_of(rows)
    if missing:
        body["partial"] = {
            "done": len(rows) - missing,
            "missing": missing,
            "total": len(rows),
            "location": location,
        }
    return body


def missing_of(rows: Sequence[object | None]) -> int:
    return sum(1 for r in rows if r is None)


def partial_headers(missing: int, location: str) -> dict[str, str]:
    """A partial answer's headers: what it lacks and where the rest are."""
    return {
        MISSING_HEADER: str(missing),
        "Location": location,
        "Preference-Applied": PARTIAL_RESULTS,
    }
