"""OpenAI's completions API on the wire: the request, the answer, and a stream's
server-sent events (OpenAI's chunk shape, each with an ``id:`` field, the index of its
token). Pure.

Supported: one prompt string, ``max_tokens``, ``temperature``, ``seed``, ``stop``,
``stream``, ``stream_options.include_usage``, ``user`` (ignored), ``n`` = 1. Other
OpenAI fields are refused naming the field.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from core.errors import DeadlineExceeded, InvalidInput, ModelError
from core.limits import ascii_decimal
from core.vocab import RequestStatus
from results.requests import AnswerRow

ID_PREFIX = "cmpl-"
# Token indices a stream may name (Last-Event-ID, ?after=).
_MAX_INDEX = 1 << 20


class CompletionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    prompt: Any
    max_tokens: Any = None
    temperature: Any = None
    seed: Any = None
    stop: Any = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    n: int | None = None
    service_tier: Any = None  # read with the header by the door (decision 66)

    def sampling(self) -> dict[str, Any]:
        """The sampling fields the caller set (core/models/causal_lm.py checks them)."""
        asked = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "seed": self.seed,
            "stop": self.stop,
        }
        return {k: v for k, v in asked.items() if v is not None}


def one_prompt(value: Any) -> Any:
    """One prompt: a string, or a list holding one string (as OpenAI's clients send)."""
    if isinstance(value, list):
        if len(value) != 1:
            raise InvalidInput(
                "prompt: exactly one prompt is supported per request", field="prompt"
            )
        value = value[0]
    return value


def keyed_seed(tenant_id: str, key: str) -> int:
    """The seed of a sampled completion sent with an Idempotency-Key and no seed: drawn
    from the tenant and key, so every retry samples what the first attempt did."""
    digest = hashlib.sha256(f"{tenant_id}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1  # 63 bits, as a drawn seed


def last_index(raw: str | None, field: str = "Last-Event-ID") -> int | None:
    """The last token index a caller got (``Last-Event-ID``), or a 400 naming ``field``."""
    if raw is None:
        return None
    # ASCII digits only (int() takes any script's, and spaces and underscores).
    last = -1 if raw == "-1" else ascii_decimal(raw, max_digits=7)
    if last is None:
        raise InvalidInput(
            f"Last-Event-ID must be a token index from -1 to {_MAX_INDEX - 1}",
            field="Last-Event-ID",
        )
    return checked_index(last, field)


def checked_index(last: int, field: str) -> int:
    if not -1 <= last < _MAX_INDEX:
        raise InvalidInput("the last token index is out of range", field=field)
    return last


def resume_from(last_event_id: str | None) -> int:
    """The first token index a retried stream sends: after ``Last-Event-ID``, else 0."""
    last = last_index(last_event_id)
    return 0 if last is None else last + 1


def raise_for(row: AnswerRow) -> None:
    """The error of a completion that did not succeed."""
    if row["status"] == RequestStatus.EXPIRED:
        raise DeadlineExceeded("no worker started the completion before its deadline")
    if row["status"] != RequestStatus.SUCCEEDED:
        raise ModelError(f"the completion failed: {row['error']}", field="prompt")


def completion_body(
    rid: str, created: int, model: str, row_output: dict[str, Any]
) -> dict[str, Any]:
    # OpenAI's answer is a stream's chunk object holding the whole text, with the usage.
    text, reason = row_output["text"], row_output["finish_reason"]
    return {**chunk(rid, created, model, text, reason), "usage": _token_usage(row_output)}


def _token_usage(row_output: dict[str, Any]) -> dict[str, int]:
    p, c = row_output["prompt_tokens"], row_output["completion_tokens"]
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


# ---- a stream's events --------------------------------------------------------------------


def event(index: int | None, data: dict[str, Any]) -> bytes:
    head = b"" if index is None else b"id: %d\n" % index
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


def chunk(rid: str, created: int, model: str, text: str, reason: str | None) -> dict[str, Any]:
    return {
        "id": ID_PREFIX + rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": reason}],
    }


async def ending(
    row: Any, rid: str, created: int, model: str, next_index: int, usage: bool
) -> AsyncIterator[bytes]:
    """The tokens after ``next_index`` (from the row's text offsets), the held-back
    tail and the finish reason, the usage if asked, then ``[DONE]``."""
    if row["status"] != RequestStatus.SUCCEEDED:
        why = (
            "no worker started the completion before its deadline"
            if row["status"] == RequestStatus.EXPIRED
            else f"the completion failed: {row['error']}"
        )
        yield event(None, {"error": {"message": why, "type": str(row["status"])}})
        yield b"data: [DONE]\n\n"
        return
    out = row["output"]
    text, offsets = out["text"], out["offsets"]
    pos = offsets[next_index - 1] if 0 < next_index <= len(offsets) else 0
    for i in range(next_index, len(offsets)):
        piece = text[pos : offsets[i]]
        pos = offsets[i]
        if piece:
            yield event(i, chunk(rid, created, model, piece, None))
    yield event(len(offsets), chunk(rid, created, model, text[pos:], out["finish_reason"]))
    if usage:
        last = {**chunk(rid, created, model, "", None), "choices": [], "usage": _token_usage(out)}
        yield event(None, last)
    yield b"data: [DONE]\n\n"
