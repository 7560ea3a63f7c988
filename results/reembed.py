"""Re-embedding a corpus on promote (decision 68): the migration job's rows, the gates
on promote and retire, and coverage as it stands.

A migration is an ordinary job of the corpus's tenant, pinned to the new version, so
it runs where every job item runs - in the capacity sync traffic leaves (backfill) -
and every output of it comes from that one version. Its items are written here, in the
promote's transaction (a refusal leaves nothing, the promote included); the caller then
produces them to Kafka (ingest/jobs/publisher.py), and any API instance finishes that
if the caller dies (the job is ``submitting`` until then: decision 10). Its ``jobs``
row and items are the tenant's own: the tenant reads, cancels and retries it like any
job, and it can be the base of the next incremental refresh (decision 61: each item
gets its content hash for the new version).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from sqlalchemy import Connection, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from core.errors import InvalidInput, NotFound
from core.ids import uuid7
from core.limits import canonical_uuid, shown
from core.models import lifecycle
from core.models.lifecycle import Change
from core.models.reembed import (
    CORPUS_JOB,
    Corpus,
    Migration,
    check_gate,
    check_retire,
    check_source,
)
from core.models.registry import VersionRecord, VersionState
from core.models.spec import ModelSpec
from core.vocab import RequestStatus
from results import modelregistry
from results.registry_schema import model_migrations
from results.schema import jobs
from results.tenants import get_tenant

# (tenant id, the job's params) -> an item's content hash from its input (decision 61's
# hash, which the API's staging computes: ingest/jobs/incremental.py ``hasher_for``).
Hasher = Callable[[str, dict[str, Any]], Callable[[Any], bytes]]
# The spec a version's record makes (core/models/registry.py ``spec_from_record`` with
# the caller's settings): its params normalise the migration job's.
SpecOf = Callable[[VersionRecord], ModelSpec]


@dataclass(frozen=True)
class Maker:
    """What making a migration job takes from its caller's layer: the version's spec,
    the content hash, and the job's completion window (s)."""

    spec_of: SpecOf
    hasher: Hasher
    window_s: int


_HASH_PAGE = 5_000  # items hashed per round trip

# A job's items copied in its order, custom ids kept: the migration's item i is the
# corpus's item i. Request ids are drawn here (gen_random_uuid, PostgreSQL 13+): they
# are stored with the item before it is produced, so a publish repeated after a crash
# sends the same ids; a retry gives new ones as for any job (results/job_items.py).
_FROM_JOB = text("""
    INSERT INTO job_items (job_id, item_index, custom_id, input, request_id)
    SELECT :job, item_index, custom_id, input, gen_random_uuid()
    FROM job_items WHERE job_id = :source""")
# Each distinct input the tenant sent the model in the window and got an answer for,
# once, in the order first sent; only requests with the job's params (they change the
# vector), never job items (a job is its own corpus) nor the new version's own answers.
_FROM_LOG = text("""
    INSERT INTO job_items (job_id, item_index, custom_id, input, request_id)
    SELECT :job, (row_number() OVER (ORDER BY first_at) - 1)::int, NULL, input,
           gen_random_uuid()
    FROM (SELECT input, min(received_at) AS first_at FROM requests
          WHERE tenant_id = :tenant AND model = :model AND job_id IS NULL
            AND status = :succeeded AND input IS NOT NULL AND model_version <> :version
            AND params = CAST(:params AS jsonb)
            AND received_at >= :since AND received_at < :until
          GROUP BY input) corpus""")
# A window of indexes (they are 0..n-1 in both kinds of corpus), never "after ... LIMIT":
# the planner knows nothing of rows inserted in this transaction and sorted all of them
# for every page (1,000,000 items: 135 s; results/job_items.py ``unsent_page`` says the same).
_PAGE = text("""
    SELECT item_index, input FROM job_items
    WHERE job_id = :job AND item_index >= :first AND item_index < :end""")
_SET_HASHES = text("""
    UPDATE job_items i SET content_hash = u.h
    FROM unnest(CAST(:idx AS int4[]), CAST(:h AS bytea[])) AS u(item_index, h)
    WHERE i.job_id = :job AND i.item_index >= :first AND i.item_index < :end
      AND i.item_index = u.item_index""")
# Migrations with their job's progress as it stands (job_progress: decision 64).
_MIGRATIONS = """
    SELECT m.job_id, m.name, m.from_version, m.to_version, t.name AS tenant, m.corpus,
           m.created_at, j.total_items, p.succeeded, j.cancelled_at IS NOT NULL AS cancelled
    FROM model_migrations m
    JOIN jobs j ON j.job_id = m.job_id
    JOIN job_progress p ON p.job_id = m.job_id
    JOIN tenants t ON t.id = m.tenant_id"""


def _migration(r: Any) -> Migration:
    return Migration(
        job_id=str(r.job_id),
        name=r.name,
        from_version=r.from_version,
        to_version=r.to_version,
        tenant=r.tenant,
        corpus=dict(r.corpus),
        total=int(r.total_items),
        succeeded=int(r.succeeded or 0),
        cancelled=bool(r.cancelled),
        created_at=r.created_at,
    )


def list_migrations(conn: Connection, name: str | None = None) -> list[Migration]:
    """Every migration (of ``name``), newest first, with its coverage."""
    q = _MIGRATIONS + (" WHERE m.name = :name" if name is not None else "")
    rows = conn.execute(text(q + " ORDER BY m.created_at DESC"), {"name": name})
    return [_migration(r) for r in rows]


async def read_migrations(conn: AsyncConnection) -> list[Migration]:
    """Every migration with its coverage (the API's gauges and dashboard)."""
    return [_migration(r) for r in await conn.execute(text(_MIGRATIONS))]


async def job_migration(engine: AsyncEngine, job_id: str) -> Migration | None:
    """The migration a job carries out, if it is one (the job API shows its coverage)."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(text(_MIGRATIONS + " WHERE m.job_id = :j"), {"j": job_id})
        ).first()
    return None if row is None else _migration(row)


def promote(
    conn: Connection,
    name: str,
    version: str,
    actor: str,
    corpus: Corpus,
    maker: Maker,
) -> tuple[Change, Migration]:
    """Make ``name@version`` live and start re-embedding ``corpus`` with it, in the
    caller's transaction: only after a passing replay; any refusal leaves the registry
    as it was."""
    versions = modelregistry.load(conn, name, lock=True)
    versions.get(version)  # NotFound first: the clearer error
    check_gate(name, version, modelregistry.passing_replay(conn, name, version) is not None)
    live = versions.live()
    change = modelregistry.apply(conn, name, lambda m: lifecycle.promote(m, version), actor)
    old = live if live != version else None
    return change, start(conn, name, version, old, corpus, actor, maker)


def migrate(
    conn: Connection,
    name: str,
    version: str,
    actor: str,
    corpus: Corpus,
    maker: Maker,
) -> Migration:
    """Re-embed another corpus with ``name@version``, the live version already (one
    promote, many tenants' corpora); the same gate as ``promote``."""
    versions = modelregistry.load(conn, name, lock=True)
    if versions.get(version).state is not VersionState.LIVE:
        raise InvalidInput(
            f"{name}@{version} is not live: promote it with this corpus instead",
            field="version",
        )
    check_gate(name, version, modelregistry.passing_replay(conn, name, version) is not None)
    return start(conn, name, version, versions.previous_live, corpus, actor, maker)


def start(
    conn: Connection,
    name: str,
    version: str,
    old_version: str | None,
    corpus: Corpus,
    actor: str,
    maker: Maker,
) -> Migration:
    """Write the migration job of ``corpus`` for ``name@version`` (``submitting``: the
    caller produces it). The corpus is the named tenant's only: another tenant's job is
    not found, exactly as one that does not exist."""
    try:
        tenant = get_tenant(conn, corpus.tenant)
    except NotFound as exc:
        raise NotFound(exc.message, field="corpus.tenant") from exc
    spec = maker.spec_of(modelregistry.load(conn, name).get(version))
    job_id = uuid7()  # its items' ids follow its time (decision 72)
    if corpus.kind == CORPUS_JOB:
        source_id = canonical_uuid(str(corpus.job_id))
        source = None
        if source_id is not None:
            source = conn.execute(
                select(
                    jobs.c.model, jobs.c.model_version, jobs.c.params, jobs.c.output_expired_at
                ).where(jobs.c.job_id == source_id, jobs.c.tenant_id == tenant.id)
            ).first()
        if source is None:
            raise NotFound(
                f"no job {shown(corpus.job_id)} of tenant {shown(corpus.tenant)}",
                field="corpus.job_id",
            )
        what = f"job {source_id}"
        check_source(name, version, source.model, source.model_version, what)
        if source.output_expired_at is not None:
            raise InvalidInput(f"{what}'s items expired", field="corpus.job_id")
        old_version = source.model_version
        params = spec.normalize_params(source.params)
        n = conn.execute(_FROM_JOB, {"job": job_id, "source": source_id}).rowcount
    else:
        if old_version is None:
            raise InvalidInput(
                f"{name} had no live version before {version}: nothing to re-embed",
                field="corpus",
            )
        params = spec.normalize_params(None)
        n = conn.execute(
            _FROM_LOG,
            {
                "job": job_id,
                "tenant": tenant.id,
                "model": name,
                "version": version,
                "succeeded": str(RequestStatus.SUCCEEDED),
                "params": orjson.dumps(params).decode(),
                "since": corpus.since,
                "until": corpus.until,
            },
        ).rowcount
    if n == 0:
        raise InvalidInput(f"the corpus {corpus.described()} holds no items", field="corpus")
    _hash_items(conn, job_id, n, maker.hasher(tenant.id, params))
    conn.execute(
        jobs.insert().values(
            job_id=job_id,
            tenant_id=tenant.id,
            model=name,
            model_version=version,
            params=params,
            total_items=n,
            expires_at=datetime.now(UTC) + timedelta(seconds=maker.window_s),
        )
    )
    conn.execute(
        model_migrations.insert().values(
            job_id=job_id,
            name=name,
            from_version=old_version,
            to_version=version,
            tenant_id=tenant.id,
            corpus=corpus.described(),
            created_by=actor,
        )
    )
    return Migration(
        job_id, name, old_version, version, tenant.name, corpus.described(), n, 0, False
    )


def retire(conn: Connection, name: str, version: str, actor: str) -> Change:
    """Retire ``name@version`` unless a corpus is still moving away from it."""
    modelregistry.load(conn, name, lock=True)  # one gate at a time per model
    check_retire(name, version, list_migrations(conn, name))
    return modelregistry.apply(conn, name, lambda m: lifecycle.retire(m, version), actor)


def _hash_items(
    conn: Connection, job_id: str, total: int, item_hash: Callable[[Any], bytes]
) -> None:
    """Each new item's content hash for the new version, a window at a time."""
    for first in range(0, total, _HASH_PAGE):
        window = {"job": job_id, "first": first, "end": first + _HASH_PAGE}
        page = conn.execute(_PAGE, window).all()
        conn.execute(
            _SET_HASHES,
            {
                **window,
                "idx": [r.item_index for r in page],
                "h": [item_hash(r.input) for r in page],
            },
        )
