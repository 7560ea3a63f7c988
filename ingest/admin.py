"""The model registry's admin API: ``/v1/admin/models...``.

Only keys with the admin scope reach it (``gristmill tenants add-key NAME --admin``); a
tenant's ordinary key gets 403, a missing or unknown one 401. The key is checked here
on every call, without the request path's cache: admin calls are rare, and a revoked
admin key must stop at once. Every change is written with an audit row naming the key
(results/modelregistry.py), the same functions ``gristmill models`` calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Header, Request
from fastapi.responses import ORJSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from core.errors import Forbidden, Unauthorized, Unavailable
from core.models import lifecycle
from core.models.registry import VersionRecord, new_record
from ingest.state import get_state
from results import modelregistry
from results.tenants import admin_lookup_stmt

router = APIRouter(prefix="/v1/admin")
T = TypeVar("T")


class Register(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="name@version to register")
    backend: str = Field(description="sim, embedding or http")
    max_batch_size: int = Field(ge=1, le=100_000)
    config: dict[str, Any] = Field(default_factory=dict)
    artifact: str = ""
    sha256: str = ""
    memory_bytes: int = Field(0, ge=0)


class Share(BaseModel):
    model_config = ConfigDict(extra="forbid")

    share: float = Field(gt=0, le=1, description="of unpinned traffic, e.g. 0.1 for 10%")


class Promote(BaseModel):
    model_config = ConfigDict(extra="forbid")

    require_replay: bool = False


class Rollback(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str | None = Field(None, description="the canary to withdraw; default: the live one")


async def _admin(request: Request, authorization: str | None) -> str:
    """The actor an admin key names in the audit trail; 401/403 otherwise."""
    if not authorization:
        raise Unauthorized("missing Authorization header (expected 'Bearer <admin api key>')")
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("Authorization header must be 'Bearer <api key>'")
    st = get_state(request)
    try:
        async with st.engine.connect() as conn:
            row = (await conn.execute(admin_lookup_stmt(key.strip()))).first()
    except (SQLAlchemyError, OSError) as exc:
        raise Unavailable("cannot reach the database to check the key", retry_after_s=2) from exc
    if row is None:
        raise Unauthorized("unknown or revoked API key")
    if not row.admin:
        raise Forbidden("this key has no admin scope; the model registry needs an admin key")
    return f"key {row.prefix}... of tenant {row.name}"


async def _write(request: Request, fn: Callable[[Connection], T]) -> T:
    async with get_state(request).engine.begin() as conn:
        return await conn.run_sync(fn)


def _record(r: VersionRecord) -> dict[str, Any]:
    return {
        "model": r.name,
        "version": r.version,
        "backend": r.backend,
        "state": str(r.state),
        "canary_share": r.canary_share,
        "artifact": r.artifact,
        "sha256": r.sha256,
        "config": dict(r.config),
        "max_batch_size": r.max_batch_size,
        "memory_bytes": r.memory_bytes,
    }


def _change(c: lifecycle.Change) -> dict[str, Any]:
    return {
        "action": c.action,
        "version": c.version,
        "states": {
            v: {"state": str(s), "canary_share": share} for v, (s, share) in c.states.items()
        },
        "rollback_target": c.previous_live,
        "detail": c.detail,
    }


Auth = Annotated[str | None, Header()]


@router.get("/models")
async def list_models(request: Request, authorization: Auth = None) -> ORJSONResponse:
    await _admin(request, authorization)
    listed = await _write(request, modelregistry.list_versions)
    st = get_state(request)
    await st.catalog.refresh()
    served = st.catalog.table.served
    out = []
    for x in listed:
        s = served.get((x.record.name, x.record.version))
        out.append(
            {
                **_record(x.record),
                "created_by": x.created_by,
                "created_at": x.created_at.isoformat(),
                "updated_at": x.updated_at.isoformat(),
                "rollback_target": x.previous_live,
                "sticky": x.sticky,
                "workers": {
                    "ready": s.ready if s else 0,
                    "loading": s.loading if s else 0,
                    "unavailable": s.unavailable if s else 0,
                    "failed": s.failed if s else 0,
                    "error": s.error if s else None,
                },
            }
        )
    return ORJSONResponse({"versions": out})


@router.post("/models", status_code=201)
async def register(request: Request, body: Register, authorization: Auth = None) -> ORJSONResponse:
    actor = await _admin(request, authorization)
    record = new_record(
        body.model,
        backend=body.backend,
        max_batch_size=body.max_batch_size,
        config=body.config,
        artifact=body.artifact,
        sha256=body.sha256,
        memory_bytes=body.memory_bytes,
        settings=get_state(request).settings,
    )
    await _write(request, lambda c: modelregistry.register(c, record, actor))
    return ORJSONResponse(_record(record), status_code=201)


@router.post("/models/{name}/versions/{version}/canary")
async def canary(
    request: Request, name: str, version: str, body: Share, authorization: Auth = None
) -> ORJSONResponse:
    actor = await _admin(request, authorization)
    change = await _write(
        request,
        lambda c: modelregistry.apply(
            c, name, lambda m: lifecycle.canary(m, version, body.share), actor
        ),
    )
    return ORJSONResponse(_change(change))


@router.post("/models/{name}/versions/{version}/promote")
async def promote(
    request: Request,
    name: str,
    version: str,
    body: Promote | None = None,
    authorization: Auth = None,
) -> ORJSONResponse:
    actor = await _admin(request, authorization)
    require = body.require_replay if body is not None else False
    change = await _write(
        request, lambda c: modelregistry.promote(c, name, version, actor, require_replay=require)
    )
    return ORJSONResponse(_change(change))


@router.post("/models/{name}/rollback")
async def rollback(
    request: Request, name: str, body: Rollback | None = None, authorization: Auth = None
) -> ORJSONResponse:
    actor = await _admin(request, authorization)
    version = body.version if body is not None else None
    change = await _write(
        request,
        lambda c: modelregistry.apply(c, name, lambda m: lifecycle.rollback(m, version), actor),
    )
    return ORJSONResponse(_change(change))


@router.post("/models/{name}/versions/{version}/retire")
async def retire(
    request: Request, name: str, version: str, authorization: Auth = None
) -> ORJSONResponse:
    actor = await _admin(request, authorization)
    change = await _write(
        request,
        lambda c: modelregistry.apply(c, name, lambda m: lifecycle.retire(m, version), actor),
    )
    return ORJSONResponse(_change(change))


@router.get("/models/{name}/audit")
async def audit(
    request: Request, name: str, limit: int = 50, authorization: Auth = None
) -> ORJSONResponse:
    await _admin(request, authorization)
    rows = await _write(
        request, lambda c: modelregistry.audit_log(c, name, max(1, min(limit, 1000)))
    )
    return ORJSONResponse({"audit": [{**r, "at": r["at"].isoformat()} for r in rows]})
