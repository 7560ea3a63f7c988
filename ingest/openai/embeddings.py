"""``POST /v1/embeddings`` as OpenAI's, on the acceptance pipeline of ``/v1/infer``.

Accepted means durable (every input in Kafka), as everywhere; the key's tier sets
limits, admission and the deadline; an ``Idempotency-Key`` makes a retry name the
same results. Each input is its own request, batched by the scheduler with all other
traffic (ingest/acceptance/pipeline.py). ``Prefer: respond-async, wait=N`` (RFC 7240)
answers 202 with ``Location: /v1/requests/{id}`` when the answer is not ready within N
seconds. ``Prefer: partial-results`` answers 200 at the deadline with the inputs done by
then and where to fetch the rest (``GET /v1/embeddings/{id}``, decision 63; the shaping
is ingest/openai/partial.py). Errors are in OpenAI's shape (ingest/edge/error_shapes.py).
The wire format is ingest/openai/wire.py; what differs from OpenAI's service: decision
34. In production the fast path serves it (ingest/fast_path.py), through the same door
(``EMBEDDINGS``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Header, Request
from starlette.responses import Response

from core.errors import InvalidInput, NotFound
from core.limits import canonical_uuid, shown
from core.vocab import ServiceTier
from ingest.acceptance import inputs, pipeline
from ingest.acceptance.deferred import quoted
from ingest.acceptance.pipeline import Call, Order, Outcome
from ingest.acceptance.prefer import PARTIAL_RESULTS, Prefer, parse_prefer
from ingest.acceptance.service_tier import SERVICE_TIER_HEADER, asked_tier
from ingest.acceptance.state import AppState, get_state
from ingest.edge.auth import Caller
from ingest.edge.error_shapes import Shape, declared
from ingest.edge.json_response import ORJSONResponse
from ingest.jobs.limits import check_reads
from ingest.openai.partial import (
    missing_of,
    parse_rest_query,
    partial_answer,
    partial_headers,
    rest_location,
)
from ingest.openai.wire import (
    EmbeddingsRequest,
    check_dimensions,
    embeddings_answer,
    parse_embeddings,
    prompt_tokens,
)
from results.requests import AnswerRow, fetch_tenant_answers

router = APIRouter()


class EmbeddingsDoor:
    """One input or up to 2,048, answered in input order (or 202 when preferred)."""

    holds_slot = True

    async def order(self, st: AppState, call: Call) -> Order:
        prefer = parse_prefer(call.header_values(b"prefer"))
        body = parse_embeddings(call.body, st.settings)
        spec = await st.catalog.resolve(
            body.model, tenant_id=call.tenant.id, idempotency_key=call.idempotency_key
        )
        dim = spec.embedding_dim()
        if dim is None:
            raise InvalidInput(
                f"model {spec.ref} does not answer with embeddings; see GET /v1/models",
                field="model",
            )
        check_dimensions(body.dimensions, dim, spec.ref)
        many = len(body.inputs) > 1
        inputs.validate_each(spec, body.inputs, lambda i: f"input[{i}]" if many else "input")
        tier = asked_tier(body.service_tier, call.header(SERVICE_TIER_HEADER))
        flex = tier is ServiceTier.FLEX
        return Order(
            spec,
            body.inputs,
            spec.normalize_params(None),  # the model's defaults (embeddings: normalized)
            many=True,
            timeout_ms=body.timeout_ms,
            # respond-async: the client takes a 202 once Kafka has it, or after ``wait`` s.
            # (Flex's patience without it is the pipeline's, from the same Prefer.)
            wait_s=(prefer.wait_s or 0) if prefer.respond_async else None,
            # partial-results: at the deadline, what is done; respond-async's 202 wins,
            # and flex's (its deadline is far: it is answered whole, later).
            partial=prefer.partial and not prefer.respond_async and not flex,
            wire=(body, prefer),
            asked=body.model,  # an Idempotency-Key's fingerprint: what was sent
            sent={},
            reparams=pipeline.model_defaults,
            service_tier=tier,
        )

    def answer(self, st: AppState, call: Call, order: Order, outcome: Outcome) -> Response:
        body, prefer = order.wire
        if outcome.finished is not None:
            return _partial(outcome, order.spec.ref, body, outcome.finished)
        if outcome.rows is None:
            return _pending(outcome, body, prefer)
        many = len(outcome.rows) > 1
        for i, row in enumerate(outcome.rows):
            inputs.raise_if_unsuccessful(row, f"input[{i}]" if many else "input")
        tokens = sum(prompt_tokens(m.input) for m in outcome.messages)
        content = embeddings_answer(
            outcome.rows,
            model=order.spec.ref,
            encoding=body.encoding,
            dimensions=body.dimensions,
            tokens=tokens,
        )
        content["service_tier"] = outcome.served
        return ORJSONResponse(content, headers=outcome.limit_headers)


EMBEDDINGS = EmbeddingsDoor()


@router.post(
    "/v1/embeddings",
    summary="OpenAI's embeddings API: one input or up to 2,048, answered in input order",
    responses={
        202: {"description": "Prefer: respond-async and not ready in time; see Location"},
        **declared(Shape.OPENAI),
    },
)
async def embeddings(
    request: Request, tenant: Caller, idempotency_key: str | None = Header(default=None)
) -> Response:
    st = get_state(request)
    call = await pipeline.call_of(st, request, tenant, idempotency_key)
    return await pipeline.serve(st, EMBEDDINGS, call)


def _pending(outcome: Outcome, body: EmbeddingsRequest, prefer: Prefer) -> ORJSONResponse:
    """Not all answered in time: 202 when the client prefers it or it is flex (decision
    66), else the deadline's 504. Either way every input is accepted and its result is
    kept under its request id."""
    where = f"/v1/requests/{outcome.request_ids[0]}"
    if not prefer.respond_async and not outcome.deferred:
        raise outcome.gave_up(
            "no answer before the deadline; the inputs stay accepted and their results "
            f"can be fetched at /v1/requests/{{id}} (first: {where}); with 'Prefer: "
            f"{PARTIAL_RESULTS}' the deadline answers with the inputs done by then"
        )
    content: dict[str, Any] = {
        "object": "list",
        "status": "in_progress",
        "service_tier": outcome.served,
        "model": body.model,
        "data": [
            {"object": "request", "index": i, "request_id": rid, "url": f"/v1/requests/{rid}"}
            for i, rid in enumerate(outcome.request_ids)
        ],
    }
    headers = {**outcome.limit_headers, "Location": where}
    if outcome.deferred:
        quoted(outcome, content, headers)
    if prefer.respond_async:
        wait = f", wait={prefer.wait_s}" if prefer.wait_s is not None else ""
        headers["Preference-Applied"] = "respond-async" + wait
    return ORJSONResponse(content, status_code=202, headers=headers)


def _partial(
    outcome: Outcome, model: str, body: EmbeddingsRequest, rows: list[AnswerRow | None]
) -> ORJSONResponse:
    """The deadline passed with some inputs not done, and the client takes a part: 200
    with those done and where the rest are (decision 63). One that failed is the error
    of the whole call, as in a full answer. With none done, the deadline's 504 with the
    same headers: OpenAI's SDK refuses an answer whose ``data`` is empty."""
    _raise_if_any_unsuccessful(rows)
    where = rest_location(outcome.request_ids[0], len(rows), body.encoding, body.dimensions)
    missing = missing_of(rows)
    if missing == len(rows):
        exc = outcome.gave_up(
            f"no input done before the deadline; all {missing} keep running and are "
            f"fetched at {where} (or with the same Idempotency-Key) as they finish"
        )
        exc.headers.update(partial_headers(missing, where))
        raise exc
    outcome.timed_out()  # the missing ones missed their deadline, as a 504's would
    tokens = sum(
        prompt_tokens(m.input) for m, r in zip(outcome.messages, rows, strict=True) if r is not None
    )
    content = partial_answer(
        rows,
        model=model,
        encoding=body.encoding,
        dimensions=body.dimensions,
        tokens=tokens,
        location=where,
    )
    headers = {**outcome.limit_headers, **partial_headers(missing, where)}
    return ORJSONResponse(content, headers=headers)


@router.get(
    "/v1/embeddings/{request_id}",
    responses=declared(Shape.OPENAI),
    summary="A multi-input embeddings request's inputs done so far (a partial answer's Location)",
)
async def get_embeddings(request: Request, request_id: str, tenant: Caller) -> ORJSONResponse:
    """Every input of the request done by now, in OpenAI's shape, with ``partial`` while
    any is missing; nothing is computed again. Tenant-scoped: another tenant's ids find
    nothing."""
    st = get_state(request)
    limit_headers = check_reads(st.limiter, st.settings, tenant)
    q = parse_rest_query(request.query_params)
    first = canonical_uuid(request_id)
    if first is None:
        raise NotFound(f"no request {shown(request_id)}; ids are canonical UUIDs")
    ids = [inputs.item_request_id(first, i) for i in range(q.inputs)]
    found = {str(r["request_id"]): r for r in await fetch_tenant_answers(st.engine, tenant.id, ids)}
    rows = [found.get(rid) for rid in ids]
    _raise_if_any_unsuccessful(rows)
    done = next((r for r in rows if r is not None), None)
    where = rest_location(first, q.inputs, q.encoding, q.dimensions)
    content = partial_answer(
        rows,
        model="" if done is None else f"{done['model']}@{done['model_version']}",
        encoding=q.encoding,
        dimensions=q.dimensions,
        tokens=None,  # the inputs are not at hand here
        location=where,
    )
    missing = missing_of(rows)
    headers = {**limit_headers, **(partial_headers(missing, where) if missing else {})}
    return ORJSONResponse(content, headers=headers)


def _raise_if_any_unsuccessful(rows: list[AnswerRow | None]) -> None:
    """A finished input that failed or expired is the error of the whole answer."""
    for i, row in enumerate(rows):
        if row is not None:
            inputs.raise_if_unsuccessful(row, f"input[{i}]")
