"""What KServe's open inference protocol answers, whatever carries it (HTTP,
ingest/kserve/routes.py; gRPC, ingest/kserve/grpc_service.py): health, the catalog's
metadata and readiness, and infer's order on the acceptance pipeline and its rows."""

from __future__ import annotations

import time
from array import array
from typing import Any

from core import __version__
from core.errors import NotFound, Unavailable
from core.limits import shown
from core.models.spec import ModelSpec
from ingest.acceptance import inputs, pipeline
from ingest.acceptance.pipeline import Call, Order, Outcome
from ingest.acceptance.service_tier import SERVICE_TIER_HEADER, asked_tier
from ingest.acceptance.state import AppState
from ingest.edge.readiness import Readiness
from ingest.jobs.limits import catalog_reader
from ingest.kserve.wire import (
    V2Request,
    check_outputs,
    model_metadata,
    output_name,
    tier_for_priority,
)
from results.vectors import stored_vector

EXTENSIONS = ["binary_tensor_data"]


def server_metadata() -> dict[str, Any]:
    return {"name": "gristmill", "version": __version__, "extensions": EXTENSIONS}


def check_ready(st: AppState) -> None:
    """Ready to take requests, or 503 naming the failed checks."""
    ok, checks = st.readiness.report(time.monotonic())
    if not ok:
        failed = ", ".join(k for k in Readiness.CONDITIONS if not checks[k])
        raise Unavailable(f"not ready: {failed}", retry_after_s=1, reason="not_ready")


def ref(model: str, version: str | None) -> str:
    return f"{model}@{version}" if version else model


def _live_only(st: AppState, model: str, version: str | None) -> None:
    """Without a key only the live version is shown: another is answered as unknown."""
    if version is not None and st.catalog.known(model).version != version:
        raise NotFound(
            f"model {shown(model)} has no live version {shown(version)} (an API key shows "
            "every version)"
        )


async def metadata_of(
    st: AppState, authorization: str | None, model: str, version: str | None
) -> dict[str, Any]:
    """The registry's answer, served or not: 404 naming an unknown or retired version.
    With a key every open version (counted against its read rate); without one the
    live version only."""
    tenant = await catalog_reader(st, authorization)
    await st.catalog.refresh()
    if tenant is None:
        _live_only(st, model, version)
    spec = st.catalog.known(ref(model, version))
    every = version is None and tenant is not None
    names = st.catalog.versions(model) if every else [spec.version]
    return model_metadata(model, names, spec.embedding_dim())


async def ready_of(
    st: AppState, authorization: str | None, model: str, version: str | None
) -> dict[str, Any]:
    """404 unknown, 503 known but no worker serves it now (the catalog's own answers)."""
    if await catalog_reader(st, authorization) is None:
        await st.catalog.refresh()
        _live_only(st, model, version)
    spec = await st.catalog.resolve(ref(model, version))
    return {"name": model, "version": spec.version, "ready": True}


async def infer_order(st: AppState, call: Call, req: V2Request) -> Order:
    """Infer's parsed request as the pipeline's order: each text its own request
    message, the model resolved (the canary applies as on /v1/infer: sticky per tenant
    or Idempotency-Key) and every text validated."""
    path = call.path or {}
    asked = ref(path["model"], path.get("version"))
    spec = await st.catalog.resolve(
        asked, tenant_id=call.tenant.id, idempotency_key=call.idempotency_key
    )
    check_outputs(req, output_name(spec.embedding_dim()))
    inputs.validate_each(spec, req.texts, lambda i: f"inputs[0].data[{i}]")
    return Order(
        spec,
        req.texts,
        spec.normalize_params(None),
        many=True,
        timeout_ms=req.timeout_ms,
        timeout_field=req.timeout_field,
        tier=tier_for_priority(call.tenant.tier, req.priority),
        wire=req,
        asked=asked,  # what an Idempotency-Key's fingerprint covers: what was sent,
        sent={},  # not where routing sent it
        reparams=pipeline.model_defaults,
        # KServe's body has no room for it: the X-Service-Tier header (decision 66).
        service_tier=asked_tier(None, call.header(SERVICE_TIER_HEADER)),
    )


def infer_rows(
    order: Order, outcome: Outcome
) -> tuple[ModelSpec, list[array[float]] | None, list[Any] | None]:
    """The answered rows: an embedding model's vectors, else each input's JSON answer;
    504 (the ids to fetch later named) when the deadline passed first, the row's error
    when one failed."""
    if outcome.rows is None:
        raise outcome.gave_up(
            "no answer before the deadline; the inputs stay accepted and their results "
            f"can be fetched at /v1/requests/{{id}} (first: {outcome.request_ids[0]})"
        )
    for i, row in enumerate(outcome.rows):
        inputs.raise_if_unsuccessful(row, f"inputs[0].data[{i}]")
    spec, rows = order.spec, outcome.rows
    if spec.embedding_dim() is not None:
        return spec, [stored_vector(r) for r in rows], None
    return spec, None, [r["output"] for r in rows]
