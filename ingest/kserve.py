"""The KServe Open Inference Protocol v2 (what Triton's clients speak), on the
durable path of ``/v1/infer``: each text of an infer request is its own request
message (ingest/fanout.py), accepted once Kafka has all of them, answered when all
are in PostgreSQL. Health is public, as the protocol's probes expect; model metadata
and readiness too, for the live version only: with the API key they show every open
version (and count against the key's read rate). ``infer`` takes the same API key as
every other route (``Authorization: Bearer``).
The wire format is ingest/kserve_wire.py; errors are ``{"error": "..."}``.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Header, Request, Response

from core import __version__
from core.errors import DeadlineExceeded, NotFound, Unavailable
from core.limits import shown
from ingest.error_shapes import Shape, declared
from ingest.fanout import submit_many, validate_each
from ingest.infer import check_headers, raise_if_unsuccessful, take_instance_slot
from ingest.job_limits import catalog_reader
from ingest.kserve_wire import (
    HEADER_LENGTH,
    check_outputs,
    infer_answer,
    model_metadata,
    output_name,
    parse_infer,
    tier_for_priority,
)
from ingest.openai_wire import stored_vector
from ingest.readiness import Readiness
from ingest.state import AppState, get_state

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
    readiness: Readiness = request.app.state.readiness
    ok, checks = readiness.report(time.monotonic())
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


@router.post("/models/{model}/infer", summary="Inference (KServe v2)", responses=_INFER_RESPONSES)
@router.post(
    "/models/{model}/versions/{version}/infer",
    summary="Inference (KServe v2)",
    responses=_INFER_RESPONSES,
)
async def infer(
    request: Request,
    model: str,
    version: str | None = None,
    authorization: str | None = Header(default=None),
    idempotency_key: str | None = Header(default=None),
) -> Response:
    received = time.time()
    st = get_state(request)
    tenant = await st.auth.authenticate(authorization)  # before the body
    check_headers(st.settings, idempotency_key)
    raw = await request.body()
    take_instance_slot(st, tenant)
    try:
        req = parse_infer(raw, request.headers.get(HEADER_LENGTH), st.settings)
        # The canary applies as on /v1/infer: sticky per tenant or Idempotency-Key.
        spec = await st.catalog.resolve(
            _ref(model, version), tenant_id=tenant.id, idempotency_key=idempotency_key
        )
        dim = spec.embedding_dim()
        check_outputs(req, output_name(dim))
        validate_each(spec, req.texts, lambda i: f"inputs[0].data[{i}]")
        done = await submit_many(
            st,
            tenant,
            spec,
            req.texts,
            spec.normalize_params(None),
            received=received,
            timeout_ms=req.timeout_ms,
            idempotency_key=idempotency_key,
            asked=_ref(model, version),
            tier=tier_for_priority(tenant.tier, req.priority),
        )
    finally:
        st.inflight.release()
    if done.rows is None:
        raise DeadlineExceeded(
            "no answer before the deadline; the inputs stay accepted and their results "
            f"can be fetched at /v1/requests/{{id}} (first: {done.request_ids[0]})"
        )
    for i, row in enumerate(done.rows):
        raise_if_unsuccessful(row, f"inputs[0].data[{i}]")
    content, header_length = infer_answer(
        req,
        model=spec.name,
        version=spec.version,
        vectors=[stored_vector(r) for r in done.rows] if dim is not None else None,
        outputs=[r["output"] for r in done.rows] if dim is None else None,
    )
    headers = dict(done.limit_headers)
    if header_length is not None:
        headers[HEADER_LENGTH] = str(header_length)
        return Response(content, headers=headers, media_type="application/octet-stream")
    return Response(content, headers=headers, media_type="application/json")
