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

import time
from typing import Any

from fastapi import APIRouter, Header, Request, Response

from core import __version__
from core.errors import NotFound, Unavailable
from core.limits import shown
from ingest.acceptance import pipeline
from ingest.acceptance.pipeline import Call, Order, Outcome
from ingest.acceptance.state import AppState, get_state
from ingest.edge.auth import Caller
from ingest.edge.error_shapes import Shape, declared
from ingest.edge.readiness import Readiness
from ingest.jobs.limits import catalog_reader
from ingest.kserve.wire import (
    HEADER_LENGTH,
    check_outputs,
    infer_answer,
    model_metadata,
    output_name,
    parse_infer,
    tier_for_priority,
)
from results.vectors import stored_vector

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
    return {"name": "gristmill", "version": __version__, "extensions": ["binary_tensor_data"]}


@router.get("/health/live", summary="The process answers (KServe v2)")
async def live() -> dict[str, bool]:
    return {"live": True}


@router.get("/health/ready", summary="Ready to take requests (KServe v2)")
async def ready(request: Request) -> dict[str, bool]:
    ok, checks = get_state(request).readiness.report(time.monotonic())
    if not ok:
        failed = ", ".join(k for k in Readiness.CONDITIONS if not checks[k])
        raise Unavailable(f"not ready: {failed}", retry_after_s=1, reason="not_ready")
    return {"ready": True}


def _ref(model: str, version: str | None) -> str:
    return f"{model}@{version}" if version else model


def _live_only(st: AppState, model: str, version: str | None) -> None:
    """Without a key only the live version is shown: another is answered as unknown."""
    if version is not None and st.catalog.known(model).version != version:
        raise NotFound(
            f"model {shown(model)} has no live version {shown(version)} (an API key shows "
            "every version)"
        )


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
    # The registry's answer, served or not: 404 naming an unknown or retired version.
    # With a key every open version; without one the live version only.
    st = get_state(request)
    tenant = await catalog_reader(st, authorization)
    await st.catalog.refresh()
    if tenant is None:
        _live_only(st, model, version)
    spec = st.catalog.known(_ref(model, version))
    every = version is None and tenant is not None
    names = st.catalog.versions(model) if every else [spec.version]
    return model_metadata(model, names, spec.embedding_dim())


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
    # 404 unknown, 503 known but no worker serves it now (the catalog's own answers).
    st = get_state(request)
    if await catalog_reader(st, authorization) is None:
        await st.catalog.refresh()
        _live_only(st, model, version)
    spec = await st.catalog.resolve(_ref(model, version))
    return {"name": model, "version": spec.version, "ready": True}


class KServeDoor:
    """KServe's infer: each text of the request is its own request message."""

    holds_slot = True

    async def order(self, st: AppState, call: Call) -> Order:
        req = parse_infer(call.body, call.header(HEADER_LENGTH.lower().encode()), st.settings)
        # The canary applies as on /v1/infer: sticky per tenant or Idempotency-Key.
        path = call.path or {}
        spec = await st.catalog.resolve(
            _ref(path["model"], path.get("version")),
            tenant_id=call.tenant.id,
            idempotency_key=call.idempotency_key,
        )
        check_outputs(req, output_name(spec.embedding_dim()))
        pipeline.validate_each(spec, req.texts, lambda i: f"inputs[0].data[{i}]")
        return Order(
            spec,
            req.texts,
            spec.normalize_params(None),
            many=True,
            timeout_ms=req.timeout_ms,
            tier=tier_for_priority(call.tenant.tier, req.priority),
            wire=req,
            asked=_ref(path["model"], path.get("version")),  # what an Idempotency-Key's
            sent={},  # fingerprint covers: what was sent, not where routing sent it
            reparams=pipeline.model_defaults,
        )

    def answer(self, st: AppState, call: Call, order: Order, outcome: Outcome) -> Response:
        if outcome.rows is None:
            raise outcome.gave_up(
                "no answer before the deadline; the inputs stay accepted and their results "
                f"can be fetched at /v1/requests/{{id}} (first: {outcome.request_ids[0]})"
            )
        for i, row in enumerate(outcome.rows):
            pipeline.raise_if_unsuccessful(row, f"inputs[0].data[{i}]")
        spec, rows = order.spec, outcome.rows
        vector = spec.embedding_dim() is not None
        content, header_length = infer_answer(
            order.wire,
            model=spec.name,
            version=spec.version,
            vectors=[stored_vector(r) for r in rows] if vector else None,
            outputs=None if vector else [r["output"] for r in rows],
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
