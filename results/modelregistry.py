"""The model registry in PostgreSQL: versions, their states, the audit trail, and which
versions the schedulers' workers serve.

Versions (``model_versions``) and the rollback target (``model_names``) change only
through ``register`` and ``apply``: each locks the model's row, decides with the pure
rules of core/models/lifecycle.py, writes the new states with an audit row (who, when,
what) in the same transaction, and sends ``NOTIFY gristmill_models`` so every API
instance re-reads the routes at once (they also re-read them every second).

Schedulers report, per version, how many of their workers are ready, loading, cut off
from their upstream or failed (``model_readiness``); the API serves a version when some
fresh report has a ready worker. The older ``models`` table stays: the announce
heartbeat the planner reads.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import Connection, Select, and_, delete, func, select, text, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from core.errors import Conflict, NotFound
from core.models.lifecycle import Change, ModelVersions
from core.models.readiness import Readiness
from core.models.registry import VersionRecord, VersionState
from results.registry_schema import (
    model_audit,
    model_curves,
    model_names,
    model_readiness,
    model_replays,
    model_versions,
)
from results.schema import models

# Announcements and readiness older than this mean no live worker (s): six missed
# heartbeats of the scheduler (it reports every 5 s; readiness every second).
STALE_AFTER_S = 30.0
READINESS_STALE_S = 5.0
MODELS_CHANNEL = "gristmill_models"


# ---- the announce heartbeat (planner) ---------------------------------------------
def announce(
    conn: Connection, name: str, version: str, max_batch_size: int, profile_ms: dict[int, float]
) -> None:
    stmt = insert(models).values(
        name=name,
        version=version,
        max_batch_size=max_batch_size,
        profile_ms={str(k): v for k, v in profile_ms.items()},
    )
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["name", "version"],
            set_={
                "max_batch_size": stmt.excluded.max_batch_size,
                "profile_ms": stmt.excluded.profile_ms,
                "last_seen_at": func.now(),
            },
        )
    )


def live_stmt() -> Select[Any]:
    """All announced models with whether each has been announced recently."""
    fresh = models.c.last_seen_at > func.now() - func.make_interval(0, 0, 0, 0, 0, 0, STALE_AFTER_S)
    return select(models.c.name, models.c.version, models.c.max_batch_size, fresh.label("live"))


# ---- versions -----------------------------------------------------------------------
def record_from_row(row: Any) -> VersionRecord:
    """A ``model_versions`` row as the record every stage reads."""
    m = row._mapping
    plain = {k: m[k] for k in ("name", "version", "backend", "max_batch_size", "artifact")}
    return VersionRecord(
        **plain,
        config=dict(m["config"] or {}),
        sha256=m["sha256"],
        state=VersionState(m["state"]),
        canary_share=float(m["canary_share"]),
        memory_bytes=int(m["memory_bytes"]),
    )


def versions_stmt() -> Select[Any]:
    """Every version with its model's rollback target and stickiness (one read of the
    whole registry: the API's and the schedulers' refresh)."""
    return select(model_versions, model_names.c.previous_live, model_names.c.sticky).join(
        model_names, model_names.c.name == model_versions.c.name
    )


@dataclass(frozen=True)
class Listed:
    record: VersionRecord
    created_by: str
    created_at: datetime
    updated_at: datetime
    previous_live: str | None
    sticky: str


def list_versions(conn: Connection, name: str | None = None) -> list[Listed]:
    q = versions_stmt().order_by(model_versions.c.name, model_versions.c.created_at)
    if name is not None:
        q = q.where(model_versions.c.name == name)
    return [
        Listed(
            record_from_row(r), r.created_by, r.created_at, r.updated_at, r.previous_live, r.sticky
        )
        for r in conn.execute(q)
    ]


def load(conn: Connection, name: str, *, lock: bool = False) -> ModelVersions:
    q = select(model_names).where(model_names.c.name == name)
    head = conn.execute(q.with_for_update() if lock else q).first()
    if head is None:
        raise NotFound(f"no model named {name!r} in the registry", field="model")
    rows = conn.execute(select(model_versions).where(model_versions.c.name == name)).all()
    return ModelVersions(name, {r.version: record_from_row(r) for r in rows}, head.previous_live)


def _audit(
    conn: Connection, actor: str, action: str, name: str, version: str | None, detail: Any
) -> None:
    conn.execute(
        model_audit.insert().values(
            actor=actor, action=action, name=name, version=version, detail=detail
        )
    )


def _notify(conn: Connection, name: str) -> None:
    # Delivered at commit, to every API instance listening (ingest/acceptance/catalog.py).
    conn.execute(text("select pg_notify(:ch, :name)"), {"ch": MODELS_CHANNEL, "name": name})


def register(
    conn: Connection, record: VersionRecord, actor: str, *, exist_ok: bool = False
) -> bool:
    """Add a version in state ``record.state`` (staged unless seeding the built-ins).
    ``exist_ok``: an existing version is left as it is (returns False)."""
    conn.execute(
        insert(model_names).values(name=record.name).on_conflict_do_nothing(index_elements=["name"])
    )
    conn.execute(
        select(model_names.c.name).where(model_names.c.name == record.name).with_for_update()
    )
    stmt = insert(model_versions).values(
        name=record.name,
        version=record.version,
        backend=record.backend,
        artifact=record.artifact,
        sha256=record.sha256,
        config=dict(record.config),
        max_batch_size=record.max_batch_size,
        memory_bytes=record.memory_bytes,
        state=str(record.state),
        canary_share=record.canary_share,
        created_by=actor,
    )
    if record.state is VersionState.LIVE:
        live = conn.execute(
            select(model_versions.c.version).where(
                model_versions.c.name == record.name, model_versions.c.state == "live"
            )
        ).first()
        if live is not None:
            if exist_ok:
                return False
            raise Conflict(f"{record.name}@{live.version} is live already; register as staged")
    done = conn.execute(stmt.on_conflict_do_nothing(index_elements=["name", "version"]))
    if done.rowcount == 0:
        if exist_ok:
            return False
        raise Conflict(f"{record.ref} is registered already; register a new version instead")
    _audit(
        conn,
        actor,
        "register",
        record.name,
        record.version,
        {
            "backend": record.backend,
            "artifact": record.artifact,
            "sha256": record.sha256,
            "config": dict(record.config),
            "max_batch_size": record.max_batch_size,
            "state": str(record.state),
        },
    )
    _notify(conn, record.name)
    return True


def apply(
    conn: Connection, name: str, decide: Callable[[ModelVersions], Change], actor: str
) -> Change:
    """Lock the model, decide the change (core/models/lifecycle.py), write and audit it."""
    m = load(conn, name, lock=True)
    change = decide(m)
    # Demotions first: the unique indexes allow one live and one canary at any moment.
    order = sorted(
        change.states.items(), key=lambda kv: kv[1][0] in (VersionState.LIVE, VersionState.CANARY)
    )
    for version, (state, share) in order:
        conn.execute(
            update(model_versions)
            .where(model_versions.c.name == name, model_versions.c.version == version)
            .values(state=str(state), canary_share=share, updated_at=func.now())
        )
    conn.execute(
        update(model_names)
        .where(model_names.c.name == name)
        .values(previous_live=change.previous_live, updated_at=func.now())
    )
    _audit(conn, actor, change.action, name, change.version, change.detail)
    _notify(conn, name)
    return change


def set_sticky(conn: Connection, name: str, sticky: str, actor: str) -> None:
    load(conn, name, lock=True)
    conn.execute(
        update(model_names)
        .where(model_names.c.name == name)
        .values(sticky=sticky, updated_at=func.now())
    )
    _audit(conn, actor, "sticky", name, None, {"sticky": sticky})
    _notify(conn, name)


def audit_log(conn: Connection, name: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    q = select(model_audit).order_by(model_audit.c.id.desc()).limit(limit)
    if name is not None:
        q = q.where(model_audit.c.name == name)
    return [dict(r._mapping) for r in conn.execute(q)]


# ---- readiness (schedulers) ---------------------------------------------------------
def report_readiness(conn: Connection, scheduler_id: str, rows: Iterable[Readiness]) -> None:
    """Replace this scheduler's readiness rows with ``rows``."""
    rows = list(rows)
    conn.execute(delete(model_readiness).where(model_readiness.c.scheduler_id == scheduler_id))
    if rows:
        conn.execute(
            model_readiness.insert(),
            [
                {
                    "scheduler_id": scheduler_id,
                    "name": r.name,
                    "version": r.version,
                    "ready_workers": r.ready,
                    "loading_workers": r.loading,
                    "unavailable_workers": r.unavailable,
                    "failed_workers": r.failed,
                    "error": r.error,
                    "retry_after_s": r.retry_after_s,
                }
                for r in rows
            ],
        )


def forget_readiness(conn: Connection, scheduler_id: str) -> None:
    conn.execute(delete(model_readiness).where(model_readiness.c.scheduler_id == scheduler_id))


def readiness_stmt(
    deployment: str | None = None, *, stale_s: float = READINESS_STALE_S
) -> Select[Any]:
    """Fresh readiness summed over schedulers, per version; ``deployment``: only the
    schedulers of that one (results/load.py ``process_id``: a topic prefix); ``stale_s``:
    how old a report may be (longer while commits are slow: ingest/edge/db_health.py)."""
    fresh = model_readiness.c.updated_at > func.now() - func.make_interval(
        0, 0, 0, 0, 0, 0, stale_s
    )
    if deployment is not None:
        fresh = and_(fresh, model_readiness.c.scheduler_id.startswith(f"{deployment}:"))
    return (
        select(
            model_readiness.c.name,
            model_readiness.c.version,
            func.sum(model_readiness.c.ready_workers).label("ready"),
            func.sum(model_readiness.c.loading_workers).label("loading"),
            func.sum(model_readiness.c.unavailable_workers).label("unavailable"),
            func.sum(model_readiness.c.failed_workers).label("failed"),
            func.max(model_readiness.c.error).label("error"),
            func.min(model_readiness.c.retry_after_s).label("retry_after_s"),
        )
        .where(fresh)
        .group_by(model_readiness.c.name, model_readiness.c.version)
    )


async def read_registry(
    engine: AsyncEngine, deployment: str | None, *, stale_s: float = READINESS_STALE_S
) -> tuple[list[Any], dict[tuple[str, str], Readiness]]:
    """Every version's row (``versions_stmt``) and the fresh readiness of each, summed
    over the deployment's schedulers, read together (``stale_s``: ``readiness_stmt``'s)."""
    async with engine.connect() as conn:
        rows = (await conn.execute(versions_stmt())).all()
        ready = (await conn.execute(readiness_stmt(deployment, stale_s=stale_s))).all()
    return list(rows), readiness_from_rows(ready)


def readiness_from_rows(rows: Iterable[Any]) -> dict[tuple[str, str], Readiness]:
    return {
        (r.name, r.version): Readiness(
            r.name,
            r.version,
            int(r.ready or 0),
            int(r.loading or 0),
            int(r.unavailable or 0),
            int(r.failed or 0),
            r.error,
            r.retry_after_s,
        )
        for r in rows
    }


# ---- cost curves per worker class (the planner) -------------------------------------
def report_curve(
    conn: Connection,
    name: str,
    version: str,
    worker_class: str,
    max_batch_size: int,
    profile_ms: Mapping[int, float],
    workers: int,
) -> None:
    stmt = insert(model_curves).values(
        name=name,
        version=version,
        worker_class=worker_class,
        max_batch_size=max_batch_size,
        profile_ms={str(k): v for k, v in profile_ms.items()},
        workers=workers,
    )
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["name", "version", "worker_class"],
            set_={
                "max_batch_size": stmt.excluded.max_batch_size,
                "profile_ms": stmt.excluded.profile_ms,
                "workers": stmt.excluded.workers,
                "updated_at": func.now(),
            },
        )
    )


def curves(conn: Connection, name: str, version: str | None = None) -> list[dict[str, Any]]:
    q = select(model_curves).where(model_curves.c.name == name)
    if version:
        q = q.where(model_curves.c.version == version)
    return [dict(r._mapping) for r in conn.execute(q.order_by(model_curves.c.updated_at.desc()))]


# ---- replays ------------------------------------------------------------------------
def start_replay(conn: Connection, name: str, candidate: str, actor: str, since: datetime) -> str:
    replay_id = str(uuid.uuid4())
    conn.execute(
        model_replays.insert().values(
            replay_id=replay_id, name=name, candidate=candidate, actor=actor, since=since
        )
    )
    _audit(conn, actor, "replay", name, candidate, {"replay_id": replay_id, "since": str(since)})
    return replay_id


def finish_replay(
    conn: Connection, replay_id: str, items: int, passed: bool, report: dict[str, Any]
) -> None:
    conn.execute(
        update(model_replays)
        .where(model_replays.c.replay_id == replay_id)
        .values(
            finished_at=func.now(),
            items=items,
            passed=passed,
            # NaN (no samples) is not JSON: orjson writes null for it.
            report=orjson.loads(orjson.dumps(report, option=orjson.OPT_SERIALIZE_NUMPY)),
        )
    )


def passing_replay(conn: Connection, name: str, version: str) -> dict[str, Any] | None:
    """The latest finished replay of ``name@version`` that passed, made after the version
    was registered (a re-registered version must be replayed again)."""
    registered = (
        select(model_versions.c.created_at)
        .where(model_versions.c.name == name, model_versions.c.version == version)
        .scalar_subquery()
    )
    row = conn.execute(
        select(model_replays)
        .where(
            and_(
                model_replays.c.name == name,
                model_replays.c.candidate == version,
                model_replays.c.passed.is_(True),
                model_replays.c.started_at >= registered,
            )
        )
        .order_by(model_replays.c.finished_at.desc())
        .limit(1)
    ).first()
    return dict(row._mapping) if row is not None else None


def promote(
    conn: Connection, name: str, version: str, actor: str, *, require_replay: bool = False
) -> Change:
    """Make ``name@version`` live; with ``require_replay``, only after a replay of
    recorded traffic against it passed (gristmill/replay.py)."""
    from core.models import lifecycle

    if require_replay:
        load(conn, name, lock=True).get(version)  # NotFound first: the clearer error
        if passing_replay(conn, name, version) is None:
            raise Conflict(
                f"{name}@{version} has no passing replay; run `gristmill models replay "
                f"--candidate {name}@{version}` first"
            )
    return apply(conn, name, lambda m: lifecycle.promote(m, version), actor)
