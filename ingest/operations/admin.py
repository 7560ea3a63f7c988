"""The model registry's admin API: ``/v1/admin/models...``.

Only keys with the admin scope reach it (``gristmill tenants add-key NAME --admin``;
ingest/operations/admin_auth.py checks it on every call: 401 unknown, 403 a tenant's ordinary key).
Every change is written with an audit row naming the key (results/modelregistry.py),
through the same functions ``gristmill models`` calls. A promote may name a tenant's
corpus to re-embed with the new version (decision 68, results/reembed.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from core.models import lifecycle
from core.models.reembed import Corpus, Migration, corpus_of
from core.models.registry import VersionRecord, new_record
from ingest.acceptance.state import get_state
from ingest.edge.json_response import ORJSONResponse
from ingest.jobs.incremental import reembed_maker
from ingest.operations.admin_auth import require_admin
from results import modelregistry, reembed
from results.db import in_transaction

log = logging.getLogger(__name__)
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


class CorpusBody(BaseModel):
    """A tenant's corpus to re-embed (decision 68): one of its jobs, or its request log
    for a window (``until`` defaults to now)."""

    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(min_length=1, max_length=200, description="the tenant's name")
    job_id: str | None = Field(None, max_length=100)
    since: datetime | None = None
    until: datetime | None = None

    def corpus(self) -> Corpus:
        return corpus_of(
            self.tenant,
            job_id=self.job_id,
            since=self.since,
            until=self.until,
            now=datetime.now(UTC),
        )


class Promote(BaseModel):
    model_config = ConfigDict(extra="forbid")

    require_replay: bool = False
    # Re-embed this corpus with the new version (a passing replay is then required).
    corpus: CorpusBody | None = None


class Migrate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    corpus: CorpusBody


class Rollback(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str | None = Field(None, description="the canary to withdraw; default: the live one")


async def _write(request: Request, fn: Callable[[Any], T]) -> T:
    """``fn`` (a results/modelregistry.py function of a connection) in one transaction."""
    return await in_transaction(get_state(request).engine, fn)


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


# The actor an admin key names in the audit trail (401/403 for any other caller).
Admin = Annotated[str, Depends(require_admin)]


@router.get("/models")
async def list_models(request: Request, actor: Admin) -> ORJSONResponse:
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
async def register(request: Request, actor: Admin, body: Register) -> ORJSONResponse:
    fields = body.model_dump(exclude={"model"})  # new_record's keywords, checked there
    record = new_record(body.model, **fields, settings=get_state(request).settings)
    await _write(request, lambda c: modelregistry.register(c, record, actor))
    return ORJSONResponse(_record(record), status_code=201)


@router.post("/models/{name}/versions/{version}/canary")
async def canary(
    request: Request, actor: Admin, name: str, version: str, body: Share
) -> ORJSONResponse:
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
    actor: Admin,
    name: str,
    version: str,
    body: Promote | None = None,
) -> ORJSONResponse:
    require = body.require_replay if body is not None else False
    if body is None or body.corpus is None:
        change = await _write(
            request,
            lambda c: modelregistry.promote(c, name, version, actor, require_replay=require),
        )
        return ORJSONResponse(_change(change))
    corpus, maker = body.corpus.corpus(), reembed_maker(get_state(request).settings, name, version)
    change, started = await _write(
        request, lambda c: reembed.promote(c, name, version, actor, corpus, maker)
    )
    await _publish(request, started)
    return ORJSONResponse({**_change(change), "migration": started.view()})


@router.post("/models/{name}/versions/{version}/migrations", status_code=202)
async def migrate(
    request: Request, actor: Admin, name: str, version: str, body: Migrate
) -> ORJSONResponse:
    """Re-embed another corpus with the live version (decision 68)."""
    corpus, maker = body.corpus.corpus(), reembed_maker(get_state(request).settings, name, version)
    started = await _write(
        request, lambda c: reembed.migrate(c, name, version, actor, corpus, maker)
    )
    await _publish(request, started)
    return ORJSONResponse({"migration": started.view()}, status_code=202)


@router.get("/models/{name}/migrations")
async def migrations(request: Request, actor: Admin, name: str) -> ORJSONResponse:
    """The model's re-embeds, newest first, each with its coverage."""
    listed = await _write(request, lambda c: reembed.list_migrations(c, name))
    return ORJSONResponse({"migrations": [m.view() for m in listed]})


async def _publish(request: Request, started: Migration) -> None:
    """The migration job's items into Kafka; if that fails now, the job stays
    ``submitting`` and an API instance's stale-submission pass finishes it."""
    try:
        await get_state(request).jobs.publish(started.job_id)
    except Exception as exc:  # Kafka away: the promote and the job are recorded
        log.warning("migration job %s not published yet: %s", started.job_id, exc)


@router.post("/models/{name}/rollback")
async def rollback(
    request: Request, actor: Admin, name: str, body: Rollback | None = None
) -> ORJSONResponse:
    version = body.version if body is not None else None
    change = await _write(
        request,
        lambda c: modelregistry.apply(c, name, lambda m: lifecycle.rollback(m, version), actor),
    )
    return ORJSONResponse(_change(change))


@router.post("/models/{name}/versions/{version}/retire")
async def retire(request: Request, actor: Admin, name: str, version: str) -> ORJSONResponse:
    change = await _write(
        request,
        lambda c: reembed.retire(c, name, version, actor),  # not while a corpus moves off it
    )
    return ORJSONResponse(_change(change))


@router.get("/models/{name}/audit")
async def audit(request: Request, actor: Admin, name: str, limit: int = 50) -> ORJSONResponse:
    rows = await _write(
        request, lambda c: modelregistry.audit_log(c, name, max(1, min(limit, 1000)))
    )
    return ORJSONResponse({"audit": [{**r, "at": r["at"].isoformat()} for r in rows]})
