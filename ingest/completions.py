"""``POST /v1/completions``: text generation in OpenAI's shape, durable like every request.

A completion is accepted once its message is in Kafka (decision 32); the scheduler
generates it with continuous batching and writes its tokens to PostgreSQL as they
come, and its request-log row at the end. Without ``stream`` the answer is that
row. With ``stream: true`` the caller gets server-sent events in OpenAI's chunk
shape, each with an ``id:`` field, the index of its token; a caller whose
connection dropped resumes with ``GET /v1/completions/{id}?stream=true`` and a
``Last-Event-ID`` header (the last index it got), or fetches the finished answer
with a plain ``GET``.

Supported: one prompt string, ``max_tokens``, ``temperature``, ``seed``, ``stop``,
``stream``, ``stream_options.include_usage``, ``user`` (ignored), ``n`` = 1.
Other OpenAI fields are refused naming the field.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import orjson
from fastapi import APIRouter, Header, Request
from fastapi.responses import ORJSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import and_, exists, select

from core.errors import DeadlineExceeded, InvalidInput, ModelError, NotFound
from core.limits import ascii_decimal, canonical_uuid, check_text, shown
from core.messages import RequestMessage, body_hash
from core.models.causal_lm import CausalLMSpec, generation_params
from core.models.token_ids import tokenized_input
from core.vocab import TIER_TO_CLASS, RequestStatus
from ingest.error_shapes import Shape, declared
from ingest.idempotency import aim, claim, first_version
from ingest.infer import check_headers, send_claimed
from ingest.job_limits import check_reads, hold_stream, hold_stream_of
from ingest.jobs import HeldStream
from ingest.policy import check_kv, check_rate
from ingest.schemas import parse_body
from ingest.state import AppState, get_state
from ingest.streams import StreamHub, Subscription
from ingest.waiters import RESULT_COLUMNS
from results.schema import generation_progress, requests
from results.tenants import Tenant

router = APIRouter()

ID_PREFIX = "cmpl-"
# How long a non-streaming caller is waited for (s): OpenAI's Python client waits
# 600 s by default, so it gives up first and sees its own timeout, not ours.
COMPLETION_WAIT_S = 600.0
# A stream with no token for this long sends an SSE comment (s), so proxies and
# clients that drop idle connections keep it while a request waits its turn.
KEEPALIVE_S = 15.0


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


def _prompt(value: Any) -> Any:
    """One prompt: a string, or a list holding one string (as OpenAI's clients send)."""
    if isinstance(value, list):
        if len(value) != 1:
            raise InvalidInput(
                "prompt: exactly one prompt is supported per request", field="prompt"
            )
        value = value[0]
    return value


def completion_body(
    rid: str, created: int, model: str, row_output: dict[str, Any]
) -> dict[str, Any]:
    prompt, done = row_output["prompt_tokens"], row_output["completion_tokens"]
    return {
        "id": ID_PREFIX + rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "text": row_output["text"],
                "index": 0,
                "logprobs": None,
                "finish_reason": row_output["finish_reason"],
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": done,
            "total_tokens": prompt + done,
        },
    }


def _raise_for(row: dict[str, Any]) -> None:
    if row["status"] == RequestStatus.EXPIRED:
        raise DeadlineExceeded("no worker started the completion before its deadline")
    if row["status"] != RequestStatus.SUCCEEDED:
        raise ModelError(f"the completion failed: {row['error']}", field="prompt")


def keyed_seed(tenant_id: str, key: str) -> int:
    """The seed of a sampled completion sent with an Idempotency-Key and no seed: drawn
    from the tenant and key, so every retry samples what the first attempt did. Pure."""
    digest = hashlib.sha256(f"{tenant_id}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1  # 63 bits, as a drawn seed


def _last_index(value: str, field: str) -> int:
    """A token index a client sends back: -1 or ASCII digits below 2**20, else 400."""
    last = -1 if value == "-1" else ascii_decimal(value, max_digits=7)
    if last is None or not -1 <= last < 1 << 20:
        raise InvalidInput(f"{field} must be a token index from -1 to {(1 << 20) - 1}", field=field)
    return last


def _resume_from(last_event_id: str | None) -> int:
    """The first token index a retried stream sends: after ``Last-Event-ID``, else 0."""
    return 0 if last_event_id is None else _last_index(last_event_id, "Last-Event-ID") + 1


async def _resend(
    st: AppState,
    rid: str,
    tenant_id: str,
    first_deadline: datetime | None,
    fut: asyncio.Future[dict[str, Any]],
) -> bool:
    """A retry with a claimed key: whether to send the request again. Not when it is
    finished (``fut`` gets its row) or generating (it has progress rows); else only once
    the first attempt's first-token deadline passed, when it may never have reached
    Kafka (same request id: at most one final row either way)."""
    done = await st.waiter.fetch([rid])
    if done:
        if not fut.done():
            fut.set_result(done[0])
        return False
    async with st.engine.connect() as conn:
        generating = (
            await conn.execute(
                select(
                    exists().where(
                        and_(
                            generation_progress.c.request_id == rid,
                            generation_progress.c.tenant_id == tenant_id,
                        )
                    )
                )
            )
        ).scalar_one()
    if generating:
        return False
    return first_deadline is not None and first_deadline < datetime.now(UTC)


@router.post(
    "/v1/completions", responses=declared(Shape.OPENAI), summary="Generate text (OpenAI shape)"
)
async def create_completion(
    request: Request,
    authorization: str | None = Header(default=None),
    idempotency_key: str | None = Header(default=None),
    last_event_id: str | None = Header(default=None),
) -> Any:
    """With an ``Idempotency-Key``, a retry of the same body is the same request: its
    stored answer, or its stream from the start (after ``Last-Event-ID`` if sent)."""
    received = time.time()
    st = get_state(request)
    tenant = await st.auth.authenticate(authorization)
    check_headers(st.settings, idempotency_key)
    resume = _resume_from(last_event_id)  # used by a retry only
    body = parse_body(await request.body(), CompletionBody)
    check_text(body.model, "model", max_chars=st.settings.max_model_chars)
    if body.n not in (None, 1):
        raise InvalidInput("n: only one completion per request is supported", field="n")
    spec = await st.catalog.resolve(
        body.model, tenant_id=tenant.id, idempotency_key=idempotency_key
    )
    if not isinstance(spec, CausalLMSpec):
        raise InvalidInput(
            f"model {shown(body.model)} does not generate text; use /v1/infer", field="model"
        )
    prompt = _prompt(body.prompt)
    ids = spec.encode_prompt(prompt, field="prompt")
    params = generation_params(
        {
            k: v
            for k, v in (
                ("max_tokens", body.max_tokens),
                ("temperature", body.temperature),
                ("seed", body.seed),
                ("stop", body.stop),
            )
            if v is not None
        }
    )
    spec.check_fits(len(ids), params["max_tokens"])
    if idempotency_key is not None and body.seed is None and "seed" in params:
        # A retry must draw what the first attempt drew (and hash alike).
        params["seed"] = keyed_seed(tenant.id, idempotency_key)
    first_deadline = received + st.settings.default_timeout_ms / 1000
    check_kv(st.load, tenant, spec.ref, len(ids), params["max_tokens"], first_deadline)
    limit_headers = check_rate(st.limiter, st.settings, tenant)
    # A stream holds its connection while it generates: one of the key's stream slots,
    # taken before anything is claimed or sent (a 429 here leaves nothing accepted).
    release = hold_stream(st, tenant) if body.stream else None
    rid, registered = str(uuid.uuid4()), False  # a claim may name an earlier request
    try:
        msg = _message(st, spec, tenant, rid, tokenized_input(prompt, ids), params, received)
        c = None
        if idempotency_key is not None:
            # What is asked, not how it is delivered (``stream`` is not in the hash, so a
            # dropped stream may be retried as a plain POST) nor where routing sent it.
            msg.body_hash = body_hash(body.model, prompt, params)
            c = await claim(
                st.engine,
                tenant_id=tenant.id,
                key=idempotency_key,
                request_id=rid,
                body_hash=msg.body_hash,
                deadline=msg.deadline,
                received=received,
                model_version=spec.version,
                ttl_h=st.settings.idempotency_ttl_h,
                legacy_hash=lambda: body_hash(spec.ref, prompt, params),
            )
            rid = msg.request_id = c.request_id
            if not c.first and c.first_received is not None:
                # The first attempt's time: its row's key (the request log's partition).
                msg.received_at = c.first_received.timestamp()
        fut, registered, start, send = st.waiter.register(rid), True, 0, True
        if c is not None and not c.first:
            send = await _resend(st, rid, tenant.id, c.first_deadline, fut)
            start = resume
            if send and (first := await first_version(st.catalog, spec, c)) is not spec:
                aim(msg, first, prompt)  # to the version the first attempt was routed to
        if send:
            await send_claimed(
                st, tenant, msg, first_claim=c is None or c.first, key=idempotency_key
            )
    except BaseException:
        if registered:
            st.waiter.discard(rid)
        if release is not None:
            release()
        raise
    created = int(received)
    if release is not None:
        usage = bool((body.stream_options or {}).get("include_usage"))
        return HeldStream(
            _sse(st, rid, tenant.id, spec.name, created, start, fut, usage),
            release,
            media_type="text/event-stream",
            headers={**limit_headers, "Cache-Control": "no-cache", "X-Request-Id": rid},
        )
    try:
        row = await asyncio.wait_for(asyncio.shield(fut), timeout=COMPLETION_WAIT_S)
    except TimeoutError as exc:
        raise DeadlineExceeded(
            f"no answer within {COMPLETION_WAIT_S:g} s; it stays accepted: "
            f"GET /v1/completions/{ID_PREFIX}{rid}"
        ) from exc
    finally:
        st.waiter.discard(rid)
    _raise_for(row)
    return ORJSONResponse(
        completion_body(rid, created, spec.name, row["output"]), headers=limit_headers
    )


def _message(
    st: AppState,
    spec: CausalLMSpec,
    tenant: Tenant,
    rid: str,
    input_: Any,
    params: dict[str, Any],
    received: float,
) -> RequestMessage:
    # The deadline is for the first token (decision 23): a started answer is not cut off.
    return RequestMessage(
        request_id=rid,
        tenant_id=tenant.id,
        priority=TIER_TO_CLASS[tenant.tier],
        model=spec.name,
        version=spec.version,
        input=input_,
        params=params,
        deadline=received + st.settings.default_timeout_ms / 1000,
        received_at=received,
        weight=tenant.weight,
    )


def _hub(st: AppState) -> StreamHub:
    if st.streams is None:
        st.streams = StreamHub(st.engine)
    return st.streams


def _event(index: int | None, data: dict[str, Any]) -> bytes:
    head = b"" if index is None else b"id: %d\n" % index
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


def _chunk(rid: str, created: int, model: str, text: str, reason: str | None) -> dict[str, Any]:
    return {
        "id": ID_PREFIX + rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": reason}],
    }


async def _sse(
    st: AppState,
    rid: str,
    tenant_id: str,
    model: str,
    created: int,
    next_index: int,
    fut: asyncio.Future[dict[str, Any]],
    usage: bool,
) -> AsyncIterator[bytes]:
    """Tokens from ``next_index`` on as they are written, then the end from the row."""
    hub = _hub(st)
    sub: Subscription = hub.subscribe(rid, tenant_id, next_index)
    try:
        while True:
            get = asyncio.ensure_future(sub.tokens.get())
            both: set[asyncio.Future[Any]] = {get, fut}
            done, _ = await asyncio.wait(
                both, timeout=KEEPALIVE_S, return_when=asyncio.FIRST_COMPLETED
            )
            if get in done:
                index, piece = get.result()
                if piece:
                    yield _event(index, _chunk(rid, created, model, piece, None))
                continue
            get.cancel()
            if fut.done():
                break
            yield b": waiting\n\n"
        # Tokens the hub read but this loop did not take yet come before the end; from
        # here on the hub's pushes are ignored (taken at once, before any await).
        hub.unsubscribe(sub)
        rest: list[tuple[int, str]] = []
        while not sub.tokens.empty():
            rest.append(sub.tokens.get_nowait())
        after = sub.next_index
        for index, piece in rest:
            if piece:
                yield _event(index, _chunk(rid, created, model, piece, None))
        async for part in _ending(fut.result(), rid, created, model, after, usage):
            yield part
    finally:
        hub.unsubscribe(sub)
        st.waiter.discard(rid)


async def _ending(
    row: dict[str, Any], rid: str, created: int, model: str, next_index: int, usage: bool
) -> AsyncIterator[bytes]:
    """The tokens after ``next_index`` (from the row's text offsets), the held-back
    tail and the finish reason, the usage if asked, then ``[DONE]``."""
    if row["status"] != RequestStatus.SUCCEEDED:
        why = (
            "no worker started the completion before its deadline"
            if row["status"] == RequestStatus.EXPIRED
            else f"the completion failed: {row['error']}"
        )
        yield _event(None, {"error": {"message": why, "type": str(row["status"])}})
        yield b"data: [DONE]\n\n"
        return
    out = row["output"]
    text, offsets = out["text"], out["offsets"]
    pos = offsets[next_index - 1] if 0 < next_index <= len(offsets) else 0
    for i in range(next_index, len(offsets)):
        piece = text[pos : offsets[i]]
        pos = offsets[i]
        if piece:
            yield _event(i, _chunk(rid, created, model, piece, None))
    yield _event(len(offsets), _chunk(rid, created, model, text[pos:], out["finish_reason"]))
    if usage:
        p, c = out["prompt_tokens"], out["completion_tokens"]
        yield _event(
            None,
            {
                **_chunk(rid, created, model, "", None),
                "choices": [],
                "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c},
            },
        )
    yield b"data: [DONE]\n\n"


@router.get(
    "/v1/completions/{completion_id}",
    responses=declared(Shape.OPENAI),
    summary="A completion by id: its stored answer, or its stream resumed",
)
async def get_completion(
    request: Request,
    completion_id: str,
    stream: bool = False,
    after: int | None = None,
    authorization: str | None = Header(default=None),
    last_event_id: str | None = Header(default=None),
) -> Any:
    """``stream=true`` resumes the stream after the token ``Last-Event-ID`` (or
    ``after``) names; without it, the finished completion."""
    st = get_state(request)
    tenant = await st.auth.authenticate(authorization)
    limit_headers = check_reads(st.limiter, st.settings, tenant)
    rid = canonical_uuid(completion_id.removeprefix(ID_PREFIX))
    if rid is None:
        raise NotFound(f"no completion {shown(completion_id)}; ids are cmpl-<uuid>")
    last = after
    if last_event_id is not None:
        last = _last_index(last_event_id, "Last-Event-ID")
    if last is not None and not -1 <= last < 1 << 20:
        raise InvalidInput("the last token index is out of range", field="after")
    async with st.engine.connect() as conn:
        # Progress first: its rows go in the transaction that writes the final row, so
        # a request not seen generating by this statement is seen finished by the next.
        generating = (
            await conn.execute(
                select(
                    exists().where(
                        and_(
                            generation_progress.c.request_id == rid,
                            generation_progress.c.tenant_id == tenant.id,
                        )
                    )
                )
            )
        ).scalar_one()
        row = (
            await conn.execute(
                select(*RESULT_COLUMNS).where(
                    requests.c.request_id == rid, requests.c.tenant_id == tenant.id
                )
            )
        ).first()
    started = generating or row is not None
    if not started:
        raise NotFound(
            f"no completion {ID_PREFIX}{rid} with tokens for this tenant "
            "(it may still be queued: retry shortly)"
        )
    if row is not None and not generating:
        # One of the tenant's requests, but not a completion: its answer is elsewhere.
        spec = st.catalog.recorded(row.model, row.model_version)
        if not isinstance(spec, CausalLMSpec):
            raise NotFound(
                f"{ID_PREFIX}{rid} is not a completion (model {row.model} does not generate "
                f"text); its answer is at /v1/requests/{rid}"
            )
    created = int(time.time())
    model = row.model if row is not None else "gristmill-lm"
    if not stream:
        if row is None:
            raise NotFound(f"completion {ID_PREFIX}{rid} is still generating; stream it instead")
        data = dict(row._mapping)
        _raise_for(data)
        created = int(data["received_at"].timestamp())
        return ORJSONResponse(
            completion_body(rid, created, data["model"], data["output"]), headers=limit_headers
        )
    release, fut = hold_stream_of(st, tenant, rid)
    if row is not None and not fut.done():
        fut.set_result(dict(row._mapping))
    start = 0 if last is None else last + 1
    return HeldStream(
        _sse(st, rid, tenant.id, model, created, start, fut, usage=False),
        release,
        media_type="text/event-stream",
        headers={**limit_headers, "Cache-Control": "no-cache", "X-Request-Id": rid},
    )
