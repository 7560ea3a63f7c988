"""``POST /v1/infer``: one request, answered when its result is in PostgreSQL; and
``GET /v1/requests/{id}``, a finished request's result for a caller whose wait timed out.

In production ``POST /v1/infer`` is served in front of FastAPI (ingest/fast_path.py,
decision 16) by the same door (``INFER``); the route here documents it in OpenAPI and
serves it when the app runs without the fast path.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Header, Request
from starlette.responses import Response

from core.errors import NotFound
from core.limits import canonical_uuid, shown
from core.vocab import RequestStatus
from ingest.acceptance.deferred import deferred_answer
from ingest.acceptance.pipeline import Call, Order, Outcome, call_of, serve
from ingest.acceptance.service_tier import SERVICE_TIER_HEADER, asked_tier
from ingest.acceptance.state import AppState, get_state
from ingest.edge.auth import Caller
from ingest.edge.error_shapes import ERROR_RESPONSES
from ingest.edge.json_response import ORJSONResponse
from ingest.jobs.limits import check_reads
from ingest.native.wire import InferAnswer, RequestRecord, accept, parse_infer, result_body
from results.requests import fetch_request

router = APIRouter()


class InferDoor:
    """``POST /v1/infer`` on the acceptance pipeline: one input, its answer or 504."""

    holds_slot = True

    async def order(self, st: AppState, call: Call) -> Order:
        body = parse_infer(call.body, st.settings)
        spec = await st.catalog.resolve(
            body.model, tenant_id=call.tenant.id, idempotency_key=call.idempotency_key
        )
        # Policy after validation: a malformed request is a 4xx whatever the load.
        return Order(
            spec,
            [body.input],
            accept(spec, body),
            timeout_ms=body.timeout_ms,
            wire=body,
            asked=body.model,  # an Idempotency-Key's fingerprint: what was sent
            sent=body.params or {},
            reparams=accept,
            service_tier=asked_tier(body.service_tier, call.header(SERVICE_TIER_HEADER)),
        )

    def answer(self, st: AppState, call: Call, order: Order, outcome: Outcome) -> Response:
        if outcome.rows is None:
            rid = outcome.request_ids[0]
            if outcome.deferred:  # flex: it runs on; its result will be there
                where = f"/v1/requests/{rid}"
                return deferred_answer(outcome, where, {"request_id": rid, "url": where})
            raise outcome.gave_up(
                f"no result within timeout_ms={outcome.timeout_ms}; the request stays "
                f"accepted and its result can be fetched at /v1/requests/{rid}"
            )
        # A retry of a finished request reports the request's own time, not this call's.
        total_ms = None if outcome.replayed else (time.time() - call.received) * 1000
        content = result_body(outcome.rows[0], total_ms)
        content["service_tier"] = outcome.served
        return ORJSONResponse(content, headers=outcome.limit_headers)


INFER = InferDoor()


@router.post(
    "/v1/infer",
    response_model=InferAnswer,
    summary="Run one input through a model and wait for its answer",
    responses={
        **ERROR_RESPONSES,
        202: {"description": "service_tier flex, not done in time: see Location"},
    },
)
async def infer(
    request: Request, tenant: Caller, idempotency_key: str | None = Header(default=None)
) -> Response:
    # The body is declared in create_app (ingest/app.py), with the caps in force.
    st = get_state(request)
    return await serve(st, INFER, await call_of(st, request, tenant, idempotency_key))


@router.get(
    "/v1/requests/{request_id}",
    response_model=RequestRecord,
    responses=ERROR_RESPONSES,
    summary="A finished request's result, for a caller whose wait timed out",
)
async def get_request(request: Request, request_id: str, tenant: Caller) -> ORJSONResponse:
    """A request's result by id. Tenant-scoped: another tenant's id is a 404."""
    st = get_state(request)
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
