"""OpenAI's embeddings API on the wire: the request as OpenAI defines it, Gristmill's
answers in OpenAI's shapes. Pure: no I/O, errors are ``InvalidInput`` (400) naming
the field (``param`` in OpenAI's error body).

What differs from OpenAI's service, and why: docs/decisions/0034-openai-and-kserve-
protocols.md.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.config import Settings
from core.errors import InvalidInput, SchemaViolation
from core.limits import check_int, check_text, shown
from core.models.token_ids import is_tokenized
from ingest.edge.bodies import json_object
from results.vectors import (
    ITEMSIZE,
    EncodingFormat,
    answer_output,
    from_floats,
    stored_vector,
    to_base64,
)

# OpenAI's own cap on inputs in one embeddings request.
MAX_INPUTS = 2048
# ``user`` is an opaque end-user id; OpenAI sets no length, we cap what we read.
MAX_USER_CHARS = 256

FIELDS = frozenset(
    {"model", "input", "encoding_format", "dimensions", "user", "timeout_ms", "service_tier"}
)

TOKEN_IDS_REFUSED = (
    "input holds token ids; Gristmill cannot know which tokenizer made them (the model "
    "tokenizes text with its own tokenizer): send the text as a string or an array of "
    "strings (LangChain: OpenAIEmbeddings(check_embedding_ctx_length=False))"
)


@dataclass(frozen=True)
class EmbeddingsRequest:
    model: str
    inputs: list[str]
    encoding: EncodingFormat
    dimensions: int | None
    user: str | None
    timeout_ms: int | None  # Gristmill's extension; None: the tier's SLO
    service_tier: Any = None  # as sent: the door reads it with the header (decision 66)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse_inputs(value: Any) -> list[str]:
    """``input`` as a list of texts: a string, or an array of 1..MAX_INPUTS strings.
    Token ids (an array of ints, or of arrays of ints) are refused, saying how to send
    text instead."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise InvalidInput(
            f"input must be a string or an array of strings, got {type(value).__name__}",
            field="input",
        )
    if not value:
        raise InvalidInput("input must not be an empty array", field="input")
    if len(value) > MAX_INPUTS:
        raise InvalidInput(
            f"input holds {len(value)} items; at most {MAX_INPUTS} per request", field="input"
        )
    if _is_int(value[0]) or (isinstance(value[0], list) and value[0] and _is_int(value[0][0])):
        raise InvalidInput(TOKEN_IDS_REFUSED, field="input")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            if _is_int(item) or isinstance(item, list):
                raise InvalidInput(TOKEN_IDS_REFUSED, field=f"input[{i}]")
            raise InvalidInput(
                f"input[{i}] must be a string, got {type(item).__name__}", field=f"input[{i}]"
            )
    return value


def parse_embeddings(raw: bytes, settings: Settings) -> EmbeddingsRequest:
    """The body of ``POST /v1/embeddings``: malformed JSON and bad values are 400,
    a missing required field 422, each naming the field."""
    data = json_object(raw)
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise InvalidInput(
            f"unrecognized request argument {shown(unknown[0])} "
            f"(known: {', '.join(sorted(FIELDS))})",
            field=unknown[0] if unknown[0].isidentifier() and len(unknown[0]) <= 64 else None,
        )
    for name in ("model", "input"):
        if name not in data:
            raise SchemaViolation(f"field {name!r} is required", field=name)
    model = data["model"]
    if not isinstance(model, str) or not model:
        raise InvalidInput("model must be a non-empty string", field="model")
    check_text(model, "model", max_chars=settings.max_model_chars)
    inputs = parse_inputs(data["input"])
    fmt = data.get("encoding_format")
    if fmt is None:
        encoding = EncodingFormat.FLOAT  # OpenAI's default (its SDK asks for base64)
    elif fmt in ("float", "base64"):
        encoding = EncodingFormat(fmt)
    else:
        raise InvalidInput(
            f"encoding_format must be 'float' or 'base64', got {shown(fmt)}",
            field="encoding_format",
        )
    dims = data.get("dimensions")
    if dims is not None and (not _is_int(dims) or dims < 1):
        raise InvalidInput("dimensions must be a positive integer", field="dimensions")
    user = data.get("user")
    if user is not None:
        if not isinstance(user, str):
            raise InvalidInput("user must be a string", field="user")
        check_text(user, "user", max_chars=MAX_USER_CHARS)
    timeout_ms = data.get("timeout_ms")
    if timeout_ms is not None:
        if not _is_int(timeout_ms):
            raise InvalidInput("timeout_ms must be an integer (milliseconds)", field="timeout_ms")
        check_int(timeout_ms, "timeout_ms", lo=settings.min_timeout_ms, hi=settings.max_timeout_ms)
    return EmbeddingsRequest(
        model, inputs, encoding, dims, user, timeout_ms, data.get("service_tier")
    )


def check_dimensions(dimensions: int | None, model_dim: int, model: str) -> None:
    """``dimensions`` may shorten the model's vectors, never lengthen them."""
    if dimensions is not None and dimensions > model_dim:
        raise InvalidInput(
            f"dimensions={dimensions} exceeds model {model}'s {model_dim}; ask for 1..{model_dim}",
            field="dimensions",
        )


# --- answers ----------------------------------------------------------------------------


def shortened(values: array[float], dimensions: int | None) -> array[float]:
    """The first ``dimensions`` values, scaled back to unit length (as OpenAI's
    ``dimensions`` does); unchanged when not asked or when it is the full length."""
    if dimensions is None or dimensions >= len(values):
        return values
    head = values[:dimensions]
    norm = math.sqrt(math.fsum(x * x for x in head))
    if norm == 0.0:
        return head
    return array("f", (x / norm for x in head))


def encoded(values: array[float], encoding: EncodingFormat) -> list[float] | str:
    if encoding is EncodingFormat.BASE64:
        return to_base64(from_floats(values))
    return values.tolist()


def prompt_tokens(message_input: Any) -> int:
    """Tokens an input counted for ``usage``: the model tokenizer's ids where the API
    tokenized it (the truncated ids the model ran), else words split on whitespace
    (a model without a tokenizer here)."""
    if is_tokenized(message_input):
        return len(message_input["ids"])
    return len(str(message_input).split())


def embedding(row: Mapping[str, Any], encoding: EncodingFormat, dimensions: int | None) -> Any:
    """One input's ``embedding``. The stored float32 bytes are the answer as they are
    (base64 of them, or their values) unless ``dimensions`` shortens the vector."""
    raw = row.get("output_vector")
    if raw is not None and (dimensions is None or dimensions * ITEMSIZE >= len(raw)):
        return answer_output(None, bytes(raw), encoding)
    return encoded(shortened(stored_vector(row), dimensions), encoding)


def embeddings_answer(
    rows: Sequence[Mapping[str, Any] | None],
    *,
    model: str,
    encoding: EncodingFormat,
    dimensions: int | None,
    tokens: int,
) -> dict[str, Any]:
    """OpenAI's ``CreateEmbeddingResponse`` for finished rows in input order; an input
    not finished (None: a partial answer, decision 63) is left out, the others keep
    their ``index``."""
    return {
        "object": "list",
        "data": [
            {
                "object": "embedding",
                "index": i,
                "embedding": embedding(row, encoding, dimensions),
            }
            for i, row in enumerate(rows)
            if row is not None
        ],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def models_answer(listing: list[dict[str, Any]], owner: str = "gristmill") -> dict[str, Any]:
    """``GET /v1/models`` for OpenAI's clients and Gristmill's at once: OpenAI's list
    (``object``/``data``, one entry per servable reference: ``name`` for its latest
    version and each ``name@version``) beside Gristmill's own ``models`` key."""
    data: list[dict[str, Any]] = []
    seen: set[str] = set()
    for m in listing:
        if m.get("state") == "retired":  # answers no request (404), so not listed
            continue
        for ref in (m["model"], f"{m['model']}@{m['version']}"):
            if ref in seen:
                continue
            seen.add(ref)
            # ``created``: the registry keeps no creation time; 0 says "unknown".
            data.append({"id": ref, "object": "model", "created": 0, "owned_by": owner})
    return {"object": "list", "data": data, "models": listing}


def list_page(data: list[dict[str, Any]], *, more: bool) -> dict[str, Any]:
    """A page of OpenAI's list objects (files, batches): its ``data`` and its cursors."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }
