"""``POST /v1/infer``: one request, answered when its result is in PostgreSQL."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import ORJSONResponse

from core import tracing
from core.config import Settings
from core.errors import DeadlineExceeded, ModelError, NotFound, Unavailable
from core.limits import canonical_uuid, shown
from core.messages import RequestMessage, body_hash
from core.models.spec import ModelSpec
from core.topics import request_topic
from core.vocab import TIER_TO_CLASS, RequestStatus
from ingest import metrics
from ingest.idempotency import aim, check_key, claim, first_version, release
from ingest.job_limits import check_reads
from ingest.policy import check_admission, check_rate
from ingest.refusal_counts import TIMEOUTS, Timeout
from ingest.schemas import ERROR_RESPONSES, InferAnswer, InferBody, RequestRecord, parse_infer
from ingest.state import AppState, get_state
from ingest.tracing import annotate
from ingest.waiters import ARRIVED_AT
from results.requests import fetch_request
from results.tenants import Tenant
from results.vectors import EncodingFormat, answer_output

router = APIRouter()


def _ms(a: datetime | None, b: datetime | None) -> float | None:
    return None if a is None or b is None else round((b - a).total_seconds() * 1000, 3)


def raise_if_unsuccessful(row: dict[str, Any], field: str = "input") -> None:
    """The error a finished request's caller gets when it failed or expired."""
    if row["status"] == RequestStatus.EXPIRED:
        raise DeadlineExceeded(
            "the deadline passed before a worker could run the request", reason="expired"
        )
    if row["status"] == RequestStatus.FAILED:
        raise ModelError(f"the model failed on this input: {row['error']}", field=field)


def result_body(row: dict[str, Any], total_ms: float | None = None) -> dict[str, Any]:
    """The answer for a finished request; raises the error for a failed or expired one."""
    raise_if_unsuccessful(row)
    if total_ms is None:
        total_ms = _ms(row["received_at"], row["persisted_at"])
    return {
        "request_id": str(row["request_id"]),
        "output": answer_output(row["output"], row.get("output_vector"), EncodingFormat.FLOAT),
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


def check_headers(settings: Settings, idempotency_key: str | None) -> None:
    """What the request's own headers carry, checked before its body is read."""
    check_key(settings, idempotency_key)


def accept(spec: ModelSpec, body: InferBody) -> dict[str, Any]:
    """The model's own checks on a parsed body; returns the normalized params."""
    spec.validate_input(body.input)
    return spec.normalize_params(body.params)


def request_message(
    spec: ModelSpec,
    input_: Any,
    params: dict[str, Any],
    *,
    tenant: Tenant,
    request_id: str,
    received: float,
    timeout_ms: int,
    fingerprint: str = "",
) -> RequestMessage:
    """The Kafka message for an accepted request. Pure. ``fingerprint``: what its
    Idempotency-Key claim recorded of the body (ingest/idempotency.py), if it has one."""
    return RequestMessage(
        request_id=request_id,
        tenant_id=tenant.id,
        priority=TIER_TO_CLASS[tenant.tier],
        model=spec.name,
        version=spec.version,
        input=spec.message_input(input_),  # token ids too, where the model takes them
        params=params,
        deadline=received + timeout_ms / 1000,
        received_at=received,
        body_hash=fingerprint,
        weight=tenant.weight,
    )


async def send_claimed(
    st: AppState, tenant: Tenant, msg: RequestMessage, *, first_claim: bool, key: str | None
) -> None:
    """Produce an accepted request's message and count it admitted. If Kafka refuses it,
    a key this attempt claimed is released, so the client's retry sends it at once."""
    try:
        await st.producer.produce(
            request_topic(st.settings, msg.priority), msg.encode(), headers=tracing.headers()
        )
    except Unavailable:
        if first_claim and key is not None:
            # Nothing reached Kafka: the client's retry sends it again at once.
            await release(st.engine, tenant_id=tenant.id, key=key, request_id=msg.request_id)
        raise
    metrics.admitted(tenant.tier)


@router.post(
    "/v1/infer",
    response_model=InferAnswer,
    responses=ERROR_RESPONSES,
    summary="Run one input through a model and wait for its answer",
)
async def infer(
    request: Request,
    authorization: str | None = Header(default=None),
    idempotency_key: str | None = Header(default=None),
) -> ORJSONResponse:
    # Documents the route in OpenAPI and serves it when the app runs without the fast path
    # (ingest/fast_path.py, which calls answer_infer directly in production). The body is
    # declared in create_app (ingest/app.py), with the caps in force.
    received = time.time()
    st = get_state(request)
    tenant = await st.auth.authenticate(authorization)  # before the body
    check_headers(st.settings, idempotency_key)
    return await answer_infer(st, tenant, idempotency_key, await request.body(), received)


async def answer_infer(
    st: AppState,
    tenant: Tenant,
    idempotency_key: str | None,
    raw_body: bytes,
    received: float,
) -> ORJSONResponse:
    """``POST /v1/infer`` once the key and headers are checked and the body is in:
    errors are raised (ingest/http.py maps them)."""
    take_instance_slot(st, tenant)
    try:
        return await _infer(st, raw_body, tenant, received, idempotency_key)
    finally:
        st.inflight.release()


def take_instance_slot(st: AppState, tenant: Tenant) -> None:
    """Refuse (503) when this API instance is saturated, else hold one of its in-flight
    slots: the caller releases it (``st.inflight.release()``) when it answers."""
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


async def _infer(
    st: AppState, raw_body: bytes, tenant: Tenant, received: float, idempotency_key: str | None
) -> ORJSONResponse:
    body = parse_infer(raw_body, st.settings)
    spec = await st.catalog.resolve(
        body.model, tenant_id=tenant.id, idempotency_key=idempotency_key
    )
    params = accept(spec, body)
    # Policy after validation: a malformed request is a 4xx whatever the load.
    limit_headers = check_rate(st.limiter, st.settings, tenant)
    timeout_ms = body.timeout_ms or st.settings.tier_slo_ms.get(
        tenant.tier, st.settings.default_timeout_ms
    )
    check_admission(st.load, st.settings, tenant, spec.ref, timeout_ms)
    rid = str(uuid.uuid4())  # with an Idempotency-Key, the claim may name an earlier one
    c, fingerprint = None, ""
    if idempotency_key is not None:
        # What the caller sent, not the version routing picked (decision 44).
        fingerprint = body_hash(body.model, body.input, body.params or {})
        c = await claim(
            st.engine,
            tenant_id=tenant.id,
            key=idempotency_key,
            request_id=rid,
            body_hash=fingerprint,
            deadline=received + timeout_ms / 1000,
            received=received,
            model_version=spec.version,
            ttl_h=st.settings.idempotency_ttl_h,
            legacy_hash=lambda: body_hash(spec.ref, body.input, params),
        )
        rid = c.request_id
    msg = request_message(
        spec,
        body.input,
        params,
        tenant=tenant,
        request_id=rid,
        received=received,
        timeout_ms=timeout_ms,
        fingerprint=fingerprint,
    )
    deadline = msg.deadline
    if c is not None and not c.first and c.first_received is not None:
        # The first attempt's time: its row's key (the request log's partition).
        msg.received_at = c.first_received.timestamp()
    annotate(rid, spec.ref, tenant.tier)
    fut = st.waiter.register(rid)
    try:
        send = True
        if c is not None and not c.first:
            done = await st.waiter.fetch([rid])
            if done:
                return ORJSONResponse(result_body(done[0]), headers=limit_headers)
            # Still in flight: wait for the first attempt, unless its caller already
            # gave up, in which case it may never have reached Kafka: send it again
            # (same request id, so at most one result row either way), to the version
            # the first attempt was routed to.
            send = c.first_deadline is not None and c.first_deadline < datetime.now(UTC)
            if send and (first := await first_version(st.catalog, spec, c)) is not spec:
                msg.params = accept(first, body)
                aim(msg, first, body.input)
        if send:
            await send_claimed(
                st, tenant, msg, first_claim=c is None or c.first, key=idempotency_key
            )
        try:
            row = await asyncio.wait_for(
                asyncio.shield(fut), timeout=max(0.0, deadline - time.time())
            )
        except TimeoutError as exc:
            TIMEOUTS.record(Timeout(rid, tenant.id, msg.received_at, time.time()))
            raise DeadlineExceeded(
                f"no result within timeout_ms={timeout_ms}; the request stays accepted "
                f"and its result can be fetched at /v1/requests/{rid}"
            ) from exc
        now = time.time()
        arrived = row.get(ARRIVED_AT)
        if arrived is not None:  # the overload guard's answer delay: this instance's own part
            st.overload.answer.observe((now - arrived) * 1000)
        metrics.answered(msg, row, now)
        return ORJSONResponse(result_body(row, (now - received) * 1000), headers=limit_headers)
    finally:
        st.waiter.discard(rid)


@router.get(
    "/v1/requests/{request_id}",
    response_model=RequestRecord,
    responses=ERROR_RESPONSES,
    summary="A finished request's result, for a caller whose wait timed out",
)
async def get_request(
    request: Request, request_id: str, authorization: str | None = Header(default=None)
) -> ORJSONResponse:
    """A request's result by id. Tenant-scoped: another tenant's id is a 404."""
    st: AppState = get_state(request)
    tenant = await st.auth.authenticate(authorization)
    limit_headers = check_reads(st.limiter, st.settings, tenant)
    # Only the canonical form: PostgreSQL would take some others ({...}, bare hex) and
    # refuse the rest (urn:uuid:...) with an error that is not the client's to see.
    canonical = canonical_uuid(request_id)
    if canonical is None:
        raise NotFound(f"no request {shown(request_id)}; ids are canonical UUIDs")
    data = await fetch_request(st.engine, tenant.id, canonical)
    if data is None:
        raise NotFound(f"no finished request {canonical} for this tenant (it may still be queued)")
    return ORJSONResponse(
        {
            "status": data["status"],
            "error": data["error"],
            **(result_body(data) if data["status"] == RequestStatus.SUCCEEDED else {}),
        },
        headers=limit_headers,
    )
