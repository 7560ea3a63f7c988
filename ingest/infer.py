"""``POST /v1/infer``: one request, answered when its result is in PostgreSQL."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import ORJSONResponse
from sqlalchemy import select

from core import tracing
from core.errors import DeadlineExceeded, InvalidInput, ModelError, NotFound, Unavailable
from core.messages import RequestMessage, body_hash, request_id_for
from core.topics import request_topic
from core.vocab import TIER_TO_CLASS, RequestStatus
from ingest import metrics
from ingest.idempotency import MAX_KEY_LENGTH, claim
from ingest.policy import check_admission, check_rate
from ingest.schemas import InferBody, parse_body
from ingest.state import AppState, get_state
from ingest.tracing import annotate
from ingest.waiters import RESULT_COLUMNS
from results.schema import requests
from results.tenants import Tenant

router = APIRouter()


def _ms(a: datetime | None, b: datetime | None) -> float | None:
    return None if a is None or b is None else round((b - a).total_seconds() * 1000, 3)


def result_body(row: dict[str, Any], total_ms: float | None = None) -> dict[str, Any]:
    """The answer for a finished request; raises the error for a failed or expired one."""
    if row["status"] == RequestStatus.EXPIRED:
        raise DeadlineExceeded(
            "the deadline passed before a worker could run the request", reason="expired"
        )
    if row["status"] == RequestStatus.FAILED:
        raise ModelError(f"the model failed on this input: {row['error']}", field="input")
    if total_ms is None:
        total_ms = _ms(row["received_at"], row["persisted_at"])
    return {
        "request_id": str(row["request_id"]),
        "output": row["output"],
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


@router.post("/v1/infer")
async def infer(
    request: Request,
    authorization: str | None = Header(default=None),
    idempotency_key: str | None = Header(default=None),
) -> ORJSONResponse:
    # Documents the route in OpenAPI and serves it when the app runs without the fast path
    # (ingest/fast_path.py, which calls answer_infer directly in production).
    return await answer_infer(
        get_state(request), authorization, idempotency_key, await request.body()
    )


async def answer_infer(
    st: AppState, authorization: str | None, idempotency_key: str | None, raw_body: bytes
) -> ORJSONResponse:
    """The whole of ``POST /v1/infer`` after the HTTP plumbing: errors are raised."""
    received = time.time()
    tenant = await st.auth.authenticate(authorization)
    metrics.request_tier.set(tenant.tier)
    s = st.settings
    if st.overload.should_shed(tenant.tier, s.loop_lag_shed_ms, s.answer_delay_shed_ms):
        raise Unavailable(
            f"overloaded: this API instance's event loop is {st.overload.lag.lag_ms:.0f} ms "
            f"behind and its answers leave {st.overload.answer.ms():.0f} ms after their "
            "result is stored; retry shortly",
            retry_after_s=1,
            reason="instance_overload",
        )
    if not st.inflight.try_acquire(tenant.tier):
        raise Unavailable(
            "this API instance is at capacity; retry shortly",
            retry_after_s=1,
            reason="instance_capacity",
        )
    try:
        return await _infer(st, raw_body, tenant, received, idempotency_key)
    finally:
        st.inflight.release()


async def _infer(
    st: AppState, raw_body: bytes, tenant: Tenant, received: float, idempotency_key: str | None
) -> ORJSONResponse:
    body = parse_body(raw_body, InferBody)
    spec = await st.catalog.resolve(body.model)
    spec.validate_input(body.input)
    params = spec.normalize_params(body.params)
    # Policy after validation: a malformed request is a 4xx whatever the load.
    limit_headers = check_rate(st.limiter, st.settings, tenant)
    check_admission(st.load, st.settings, tenant, spec.ref)
    timeout_ms = body.timeout_ms or st.settings.tier_slo_ms.get(
        tenant.tier, st.settings.default_timeout_ms
    )
    if timeout_ms > st.settings.max_timeout_ms:
        raise InvalidInput(
            f"timeout_ms may be at most {st.settings.max_timeout_ms}", field="timeout_ms"
        )
    if idempotency_key is not None and not 0 < len(idempotency_key) <= MAX_KEY_LENGTH:
        raise InvalidInput(
            f"Idempotency-Key must be 1..{MAX_KEY_LENGTH} characters", field="Idempotency-Key"
        )
    deadline = received + timeout_ms / 1000
    rid = request_id_for(tenant.id, idempotency_key)
    msg = RequestMessage(
        request_id=rid,
        tenant_id=tenant.id,
        priority=TIER_TO_CLASS[tenant.tier],
        model=spec.name,
        version=spec.version,
        input=spec.message_input(body.input),  # token ids too, where the model takes them
        params=params,
        deadline=deadline,
        received_at=received,
        # Only an Idempotency-Key needs the fingerprint; skip the hashing otherwise.
        body_hash=body_hash(spec.ref, body.input, params) if idempotency_key else "",
        weight=tenant.weight,
    )
    annotate(rid, spec.ref, tenant.tier)
    fut = st.waiter.register(rid)
    try:
        send = True
        if idempotency_key is not None:
            c = await claim(
                st.engine,
                tenant_id=tenant.id,
                key=idempotency_key,
                request_id=rid,
                body_hash=msg.body_hash,
                deadline=deadline,
            )
            if not c.first:
                done = await st.waiter.fetch([rid])
                if done:
                    return ORJSONResponse(result_body(done[0]), headers=limit_headers)
                # Still in flight: wait for the first attempt, unless its caller already
                # gave up, in which case it may never have reached Kafka: send it again
                # (same request id, so at most one result row either way).
                send = c.first_deadline is not None and c.first_deadline < datetime.now(UTC)
        if send:
            topic = request_topic(st.settings, msg.priority)
            await st.producer.produce(topic, msg.encode(), headers=tracing.headers())
            metrics.admitted(tenant.tier)
        try:
            row = await asyncio.wait_for(
                asyncio.shield(fut), timeout=max(0.0, deadline - time.time())
            )
        except TimeoutError as exc:
            raise DeadlineExceeded(
                f"no result within timeout_ms={timeout_ms}; the request stays accepted "
                f"and its result can be fetched at /v1/requests/{rid}"
            ) from exc
        now = time.time()
        if row.get("persisted_at") is not None:  # the overload guard's answer delay
            st.overload.answer.observe((now - row["persisted_at"].timestamp()) * 1000)
        metrics.answered(msg, row, now)
        return ORJSONResponse(result_body(row, (now - received) * 1000), headers=limit_headers)
    finally:
        st.waiter.discard(rid)


@router.get("/v1/requests/{request_id}")
async def get_request(
    request: Request, request_id: str, authorization: str | None = Header(default=None)
) -> ORJSONResponse:
    """A request's result by id, for callers whose wait timed out. Tenant-scoped."""
    st: AppState = get_state(request)
    tenant = await st.auth.authenticate(authorization)
    try:
        uuid.UUID(request_id)
    except ValueError as exc:
        raise NotFound(f"no request {request_id}") from exc
    async with st.engine.connect() as conn:
        row = (
            await conn.execute(
                select(*RESULT_COLUMNS).where(
                    requests.c.request_id == request_id, requests.c.tenant_id == tenant.id
                )
            )
        ).first()
    if row is None:
        raise NotFound(f"no finished request {request_id} for this tenant (it may still be queued)")
    data = dict(row._mapping)
    return ORJSONResponse(
        {
            "status": data["status"],
            "error": data["error"],
            **(result_body(data) if data["status"] == RequestStatus.SUCCEEDED else {}),
        }
    )
