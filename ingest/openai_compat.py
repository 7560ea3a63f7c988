"""``POST /v1/embeddings`` as OpenAI's, on the durable path of ``/v1/infer``.

Accepted means durable (every input in Kafka), as everywhere; the key's tier sets
limits, admission and the deadline; an ``Idempotency-Key`` makes a retry name the
same results. Each input is its own request, batched by the scheduler with all
other traffic (ingest/fanout.py). ``Prefer: respond-async, wait=N`` (RFC 7240)
answers 202 with ``Location: /v1/requests/{id}`` when the answer is not ready within
N seconds. Errors are in OpenAI's shape (ingest/error_shapes.py). The wire format
is ingest/openai_wire.py; what differs from OpenAI's service: decision 34.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import ORJSONResponse

from core.errors import DeadlineExceeded, InvalidInput
from ingest.error_shapes import Shape, declared
from ingest.fanout import Submitted, submit_many, validate_each
from ingest.infer import check_headers, raise_if_unsuccessful, take_instance_slot
from ingest.openai_wire import (
    EmbeddingsRequest,
    Prefer,
    check_dimensions,
    embeddings_answer,
    parse_embeddings,
    parse_prefer,
    prompt_tokens,
)
from ingest.state import AppState, get_state
from results.tenants import Tenant

router = APIRouter()


@router.post(
    "/v1/embeddings",
    summary="OpenAI's embeddings API: one input or up to 2,048, answered in input order",
    responses={
        202: {"description": "Prefer: respond-async and not ready in time; see Location"},
        **declared(Shape.OPENAI),
    },
)
async def embeddings(
    request: Request,
    authorization: str | None = Header(default=None),
    idempotency_key: str | None = Header(default=None),
) -> ORJSONResponse:
    # Documents the route in OpenAPI and serves it when the app runs without the fast
    # path (ingest/fast_path.py serves it in production, as it does /v1/infer).
    received = time.time()
    st = get_state(request)
    tenant = await st.auth.authenticate(authorization)
    check_headers(st.settings, idempotency_key)
    prefer = parse_prefer(request.headers.getlist("prefer"))
    raw = await request.body()
    return await answer_embeddings(st, tenant, idempotency_key, prefer, raw, received)


async def answer_embeddings(
    st: AppState,
    tenant: Tenant,
    idempotency_key: str | None,
    prefer: Prefer,
    raw_body: bytes,
    received: float,
) -> ORJSONResponse:
    """``POST /v1/embeddings`` once the key and headers are checked and the body is in:
    errors are raised (ingest/http.py maps them, in OpenAI's shape)."""
    take_instance_slot(st, tenant)
    try:
        return await _embeddings(st, tenant, idempotency_key, prefer, raw_body, received)
    finally:
        st.inflight.release()


async def _embeddings(
    st: AppState,
    tenant: Tenant,
    idempotency_key: str | None,
    prefer: Prefer,
    raw_body: bytes,
    received: float,
) -> ORJSONResponse:
    body = parse_embeddings(raw_body, st.settings)
    spec = await st.catalog.resolve(
        body.model, tenant_id=tenant.id, idempotency_key=idempotency_key
    )
    dim = spec.embedding_dim()
    if dim is None:
        raise InvalidInput(
            f"model {spec.ref} does not answer with embeddings; see GET /v1/models",
            field="model",
        )
    check_dimensions(body.dimensions, dim, spec.ref)
    many = len(body.inputs) > 1
    validate_each(spec, body.inputs, lambda i: f"input[{i}]" if many else "input")
    params = spec.normalize_params(None)  # the model's defaults (embeddings: normalized)
    done = await submit_many(
        st,
        tenant,
        spec,
        body.inputs,
        params,
        received=received,
        timeout_ms=body.timeout_ms,
        idempotency_key=idempotency_key,
        asked=body.model,
        # respond-async: the client takes a 202 once Kafka has it, or after ``wait`` s.
        wait_s=(prefer.wait_s or 0) if prefer.respond_async else None,
    )
    if done.rows is None:
        return _pending(done, body, prefer)
    for i, row in enumerate(done.rows):
        raise_if_unsuccessful(row, f"input[{i}]" if many else "input")
    tokens = sum(prompt_tokens(m.input) for m in done.messages)
    return ORJSONResponse(
        embeddings_answer(
            done.rows,
            model=spec.ref,
            encoding=body.encoding,
            dimensions=body.dimensions,
            tokens=tokens,
        ),
        headers=done.limit_headers,
    )


def _pending(done: Submitted, body: EmbeddingsRequest, prefer: Prefer) -> ORJSONResponse:
    """Not all answered in time: 202 when the client prefers it, else the deadline's 504.
    Either way every input is accepted and its result is kept under its request id."""
    where = f"/v1/requests/{done.request_ids[0]}"
    if not prefer.respond_async:
        raise DeadlineExceeded(
            "no answer before the deadline; the inputs stay accepted and their results "
            f"can be fetched at /v1/requests/{{id}} (first: {where})"
        )
    content: dict[str, Any] = {
        "object": "list",
        "status": "in_progress",
        "model": body.model,
        "data": [
            {"object": "request", "index": i, "request_id": rid, "url": f"/v1/requests/{rid}"}
            for i, rid in enumerate(done.request_ids)
        ],
    }
    applied = "respond-async" + (f", wait={prefer.wait_s}" if prefer.wait_s is not None else "")
    headers = {**done.limit_headers, "Location": where, "Preference-Applied": applied}
    return ORJSONResponse(content, status_code=202, headers=headers)
