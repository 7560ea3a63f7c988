"""``POST /v1/completions``: text generation in OpenAI's shape, durable like every request.

A completion is accepted once its message is in Kafka (decision 32); the scheduler
generates it with continuous batching and writes its tokens to PostgreSQL as they
come, and its request-log row at the end. Without ``stream`` the answer is that row.
With ``stream: true`` the caller gets server-sent events (ingest/openai/
completion_wire.py) from one token stream (ports.TokenStream: its tokens in order, then
its end); a caller whose connection dropped resumes with ``GET
/v1/completions/{id}?stream=true`` and a ``Last-Event-ID`` header (the last index it
got), or fetches the finished answer with a plain ``GET``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Header, Request
from starlette.responses import Response

from core.errors import InvalidInput, NotFound
from core.limits import canonical_uuid, check_text, shown
from core.models.causal_lm import CausalLMSpec, generation_params
from core.vocab import RequestStatus, ServiceTier
from ingest.acceptance.deferred import deferred_answer
from ingest.acceptance.genai import Meter
from ingest.acceptance.pipeline import Call, Generation, Order, Outcome, call_of, serve
from ingest.acceptance.ports import Token, TokenStream
from ingest.acceptance.service_tier import SERVICE_TIER_HEADER, asked_tier
from ingest.acceptance.state import AppState, get_state
from ingest.edge.auth import Caller
from ingest.edge.bodies import parse_body
from ingest.edge.error_shapes import Shape, declared
from ingest.edge.json_response import ORJSONResponse
from ingest.jobs.limits import HeldStream, check_reads, hold_stream
from ingest.openai.completion_wire import (
    ID_PREFIX,
    CompletionBody,
    checked_index,
    chunk,
    completion_body,
    ending,
    event,
    keyed_seed,
    last_index,
    one_prompt,
    raise_for,
    resume_from,
)

router = APIRouter()

# How long a non-streaming caller is waited for (s): OpenAI's Python client waits
# 600 s by default, so it gives up first and sees its own timeout, not ours.
COMPLETION_WAIT_S = 600.0
# A stream with no token for this long sends an SSE comment (s), so proxies and
# clients that drop idle connections keep it while a request waits its turn.
KEEPALIVE_S = 15.0


class CompletionsDoor:
    """With an ``Idempotency-Key``, a retry of the same body is the same request: its
    stored answer, or its stream from the start (after ``Last-Event-ID`` if sent)."""

    holds_slot = False  # a stream is held as long as it generates, not as a sync answer

    async def order(self, st: AppState, call: Call) -> Order:
        resume = resume_from(call.header(b"last-event-id"))  # used by a retry only
        body = parse_body(call.body, CompletionBody)
        check_text(body.model, "model", max_chars=st.settings.max_model_chars)
        if body.n not in (None, 1):
            raise InvalidInput("n: only one completion per request is supported", field="n")
        spec = await st.catalog.resolve(
            body.model, tenant_id=call.tenant.id, idempotency_key=call.idempotency_key
        )
        if not isinstance(spec, CausalLMSpec):
            raise InvalidInput(
                f"model {shown(body.model)} does not generate text; use /v1/infer", field="model"
            )
        prompt = one_prompt(body.prompt)
        ids = spec.encode_prompt(prompt, field="prompt")
        params = generation_params(body.sampling())
        spec.check_fits(len(ids), params["max_tokens"])
        tier = asked_tier(body.service_tier, call.header(SERVICE_TIER_HEADER))
        key = call.idempotency_key
        if key is not None and body.seed is None and "seed" in params:
            # A retry must draw what the first attempt drew (and hash alike).
            params["seed"] = keyed_seed(call.tenant.id, key)
        # A stream holds its connection while it generates: one of the key's stream
        # slots, taken before anything is claimed or sent (a 429 here accepts nothing).
        release = hold_stream(st, call.tenant) if body.stream else None
        # What is generated, not how it is delivered: ``stream`` is not in the
        # fingerprint, so a dropped stream may be retried as a plain POST and back.
        return Order(
            spec,
            [prompt],
            params,
            # The deadline is for the first token (decision 23): a started answer is
            # not cut off, and is waited for COMPLETION_WAIT_S. Flex: its own deadline
            # and its caller's patience (decision 66).
            timeout_ms=None if tier is ServiceTier.FLEX else st.settings.default_timeout_ms,
            wait_s=None if tier is ServiceTier.FLEX else COMPLETION_WAIT_S,
            generation=Generation(len(ids), params["max_tokens"]),
            stream=body.stream,
            wire=(body, resume),
            asked=body.model,  # what was asked, not where routing sent it
            release=release,
            service_tier=tier,
        )

    def answer(self, st: AppState, call: Call, order: Order, outcome: Outcome) -> Response:
        body, resume = order.wire
        rid, created = outcome.request_ids[0], int(call.received)
        if order.release is not None:
            usage = bool((body.stream_options or {}).get("include_usage"))
            start = resume if outcome.retry else 0
            return HeldStream(
                _sse(
                    lambda: st.waiter.follow(rid, call.tenant.id, start),
                    rid,
                    order.spec.name,
                    created,
                    usage,
                    outcome.meter,
                ),
                order.release,
                media_type="text/event-stream",
                headers={
                    **outcome.limit_headers,
                    "Cache-Control": "no-cache",
                    "X-Request-Id": rid,
                },
            )
        if outcome.rows is None:
            if outcome.deferred:  # flex: it runs on; GET it when done
                where = f"/v1/completions/{ID_PREFIX}{rid}"
                return deferred_answer(outcome, where, {"id": ID_PREFIX + rid, "url": where})
            raise outcome.gave_up(
                f"no answer within {COMPLETION_WAIT_S:g} s; it stays accepted: "
                f"GET /v1/completions/{ID_PREFIX}{rid}"
            )
        row = outcome.rows[0]
        raise_for(row)
        content = completion_body(rid, created, order.spec.name, row["output"])
        content["service_tier"] = outcome.served
        return ORJSONResponse(content, headers=outcome.limit_headers)


COMPLETIONS = CompletionsDoor()


@router.post(
    "/v1/completions", responses=declared(Shape.OPENAI), summary="Generate text (OpenAI shape)"
)
async def create_completion(
    request: Request,
    tenant: Caller,
    idempotency_key: str | None = Header(default=None),
    last_event_id: str | None = Header(default=None),
) -> Response:
    """With an ``Idempotency-Key``, a retry of the same body is the same request: its
    stored answer, or its stream from the start (after ``Last-Event-ID`` if sent)."""
    st = get_state(request)
    return await serve(st, COMPLETIONS, await call_of(st, request, tenant, idempotency_key))


async def _sse(
    follow: Callable[[], TokenStream],
    rid: str,
    model: str,
    created: int,
    usage: bool,
    meter: Meter | None = None,
) -> AsyncIterator[bytes]:
    """The stream's tokens as they come, then its end (the rest from the final row).
    Opened when the response starts: a caller gone before that holds nothing. ``meter``:
    its time to first token and, once its last byte is sent, its duration and tokens
    (acceptance/genai.py); a stream its caller leaves is not measured."""
    stream = follow()
    try:
        while True:
            item = await stream.next(KEEPALIVE_S)
            if item is None:
                yield b": waiting\n\n"
            elif isinstance(item, Token):
                if item.text:
                    if meter is not None:
                        meter.first_token(time.time())
                    yield event(item.index, chunk(rid, created, model, item.text, None))
            else:
                succeeded = item.row["status"] == RequestStatus.SUCCEEDED
                async for part in ending(item.row, rid, created, model, item.next_index, usage):
                    if meter is not None and succeeded:
                        meter.first_token(time.time())  # (none came before the end)
                    yield part
                if meter is not None:
                    meter.finished(time.time(), [item.row])
                return
    finally:
        stream.close()


@router.get(
    "/v1/completions/{completion_id}",
    responses=declared(Shape.OPENAI),
    summary="A completion by id: its stored answer, or its stream resumed",
)
async def get_completion(
    request: Request,
    completion_id: str,
    tenant: Caller,
    stream: bool = False,
    after: int | None = None,
    last_event_id: str | None = Header(default=None),
) -> Any:
    """``stream=true`` resumes the stream after the token ``Last-Event-ID`` (or
    ``after``) names; without it, the finished completion."""
    st = get_state(request)
    limit_headers = check_reads(st.limiter, st.settings, tenant)
    rid = canonical_uuid(completion_id.removeprefix(ID_PREFIX))
    if rid is None:
        raise NotFound(f"no completion {shown(completion_id)}; ids are cmpl-<uuid>")
    last = last_index(last_event_id, field="after")
    if last is None and after is not None:
        last = checked_index(after, "after")
    progress = await st.waiter.progress(rid, tenant.id)
    row = progress.row
    if not progress.generating and row is None:
        raise NotFound(
            f"no completion {ID_PREFIX}{rid} with tokens for this tenant "
            "(it may still be queued: retry shortly)"
        )
    if row is not None and not progress.generating:
        # One of the tenant's requests, but not a completion: its answer is elsewhere.
        spec = st.catalog.recorded(row["model"], row["model_version"])
        if not isinstance(spec, CausalLMSpec):
            raise NotFound(
                f"{ID_PREFIX}{rid} is not a completion (model {row['model']} does not "
                f"generate text); its answer is at /v1/requests/{rid}"
            )
    if not stream:
        if row is None:
            raise NotFound(f"completion {ID_PREFIX}{rid} is still generating; stream it instead")
        raise_for(row)
        created = int(row["received_at"].timestamp())
        return ORJSONResponse(
            completion_body(rid, created, row["model"], row["output"]), headers=limit_headers
        )
    release = hold_stream(st, tenant)
    model = row["model"] if row is not None else "gristmill-lm"
    start = 0 if last is None else last + 1
    return HeldStream(
        _sse(lambda: st.waiter.follow(rid, tenant.id, start), rid, model, int(time.time()), False),
        release,
        media_type="text/event-stream",
        headers={**limit_headers, "Cache-Control": "no-cache", "X-Request-Id": rid},
    )
