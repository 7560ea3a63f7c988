"""The KServe Open Inference Protocol v2 (what Triton's clients speak), on the
acceptance pipeline of ``/v1/infer`` (ingest/acceptance/pipeline.py): each text of an
infer request is its own request message, accepted once Kafka has all of them,
answered when all are in PostgreSQL. Health is public, as the protocol's probes
expect; model metadata and readiness too, for the live version only: with the API key
they show every open version (and count against the key's read rate). ``infer`` takes
the same API key as every other route (``Authorization: Bearer``, checked by the
gate). The wire format is ingest/kserve/wire.py; errors are ``{"error": "..."}``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Header, Request, Response

from ingest.acceptance import pipeline
from ingest.acceptance.deferred import deferred_answer
from ingest.acceptance.pipeline import Call, Order, Outcome
from ingest.acceptance.state import AppState, get_state
from ingest.edge.auth import Caller
from ingest.edge.error_shapes import Shape, declared
from ingest.kserve import answers
from ingest.kserve.wire import HEADER_LENGTH, infer_answer, parse_infer

router = APIRouter(
    prefix="/v2",
    tags=["KServe v2"],
    responses=declared(Shape.KSERVE, (404, 405, 500, 503)),
)
# The catalog: public, with more to see for a key (and its read rate).
_CATALOG = declared(Shape.KSERVE, (401, 429))
# infer answers JSON, or JSON and binary tensors after it (the binary extension).
_INFER_RESPONSES: dict[int | str, Any] = {
    200: {
        "description": "the outputs",
        "content": {"application/json": {}, "application/octet-stream": {}},
    },
    **declared(Shape.KSERVE),
}


@router.get("", summary="Server metadata (KServe v2)")
async def server_metadata() -> dict[str, object]:
    return answers.server_metadata()


@router.get("/health/live", summary="The process answers (KServe v2)")
async def live() -> dict[str, bool]:
    return {"live": True}


@router.get("/health/ready", summary="Ready to take requests (KServe v2)")
async def ready(request: Request) -> dict[str, bool]:
    answers.check_ready(get_state(request))
    return {"ready": True}


@router.get("/models/{model}", summary="Model metadata (KServe v2)", responses=_CATALOG)
@router.get(
    "/models/{model}/versions/{version}", summary="Model metadata (KServe v2)", responses=_CATALOG
)
async def metadata(
    request: Request,
    model: str,
    version: str | None = None,
    authorization: str | None = Header(default=None),
) -> dict[str, object]:
    return await answers.metadata_of(get_state(request), authorization, model, version)


@router.get(
    "/models/{model}/ready", summary="A worker serves the model (KServe v2)", responses=_CATALOG
)
@router.get(
    "/models/{model}/versions/{version}/ready",
    summary="Version ready (KServe v2)",
    responses=_CATALOG,
)
async def model_ready(
    request: Request,
    model: str,
    version: str | None = None,
    authorization: str | None = Header(default=None),
) -> dict[str, object]:
    return await answers.ready_of(get_state(request), authorization, model, version)


class KServeDoor:
    """KServe's infer over HTTP: each text of the request is its own request message."""

    holds_slot = True

    async def order(self, st: AppState, call: Call) -> Order:
        req = parse_infer(call.body, call.header(HEADER_LENGTH.lower().encode()), st.settings)
        return await answers.infer_order(st, call, req)

    def answer(self, st: AppState, call: Call, order: Order, outcome: Outcome) -> Response:
        if outcome.deferred:  # flex, not done in time: it runs on (decision 66)
            rid = outcome.request_ids[0]
            where = f"/v1/requests/{rid}"
            later = {"id": order.wire.id, "request_ids": outcome.request_ids, "url": where}
            return deferred_answer(outcome, where, later)
        spec, vectors, outputs = answers.infer_rows(order, outcome)
        content, header_length = infer_answer(
            order.wire, model=spec.name, version=spec.version, vectors=vectors, outputs=outputs
        )
        headers = dict(outcome.limit_headers)
        if header_length is not None:
            headers[HEADER_LENGTH] = str(header_length)
            return Response(content, headers=headers, media_type="application/octet-stream")
        return Response(content, headers=headers, media_type="application/json")


INFER = KServeDoor()


@router.post("/models/{model}/infer", summary="Inference (KServe v2)", responses=_INFER_RESPONSES)
@router.post(
    "/models/{model}/versions/{version}/infer",
    summary="Inference (KServe v2)",
    responses=_INFER_RESPONSES,
)
async def infer(
    request: Request,
    model: str,
    tenant: Caller,
    version: str | None = None,
    idempotency_key: str | None = Header(default=None),
) -> Response:
    st = get_state(request)
    call = await pipeline.call_of(st, request, tenant, idempotency_key)
    return await pipeline.serve(st, INFER, call)
