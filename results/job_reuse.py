"""An incremental job's reused results (decision 61): each new item whose content hash
matches a succeeded item of the base job gets a result row of its own (the base's
output copied, status succeeded, ``attempts`` 0); it is never sent to Kafka. That row
is the item's mark: no computed attempt is ever recorded with ``attempts`` 0 (a
computed row holds attempt + 1), so ``reused`` is read from it (``results/job_items.py``)
and ``job_items`` is not written a second time.

Two steps, so the copy runs while the model computes the changed items (decision 61,
amended): ``match_reusable`` in the submission's transaction finds which items will be
reused (narrow rows: they are left out of the publish and of the budget charge);
``copy_reused``, in the publish after the changed items are in Kafka, writes their rows
in a transaction of its own and counts them as a results writer does. The copy is
idempotent (an item's row is keyed by its request id and the job's ``created_at``), so
a publish taken over after a crash simply runs it again.

A copy, not a pointer: every reader, the retry, the sweeper's output expiry and the
request log's retention keep treating the new job's rows as its own, and the base job
may expire or be deleted without touching the new one.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.ext.asyncio import AsyncConnection

from core.vocab import PriorityClass
from results.jobs import settle

# What a base lends, as the submission sees it: one succeeded item per content hash, its
# *current* attempt's row (job_items.request_id), read within the base job ((job_id,
# item_index) index per partition) whatever the log's size; the items it lends to are
# neither published nor charged. The tenant is in the content hash and checked again
# here. Matched on narrow rows: carrying the outputs (1.5 KB for a 384-float embedding)
# through the sort and the hash spilled 300 MB to disk twice for a 200,000-item base.
_MATCH = text("""
    WITH lent AS (
        SELECT DISTINCT ON (b.content_hash) b.content_hash
        FROM job_items b JOIN requests r ON r.request_id = b.request_id
        WHERE b.job_id = :base AND b.content_hash IS NOT NULL
          AND r.job_id = :base AND r.tenant_id = :tenant AND r.status = 'succeeded'
        ORDER BY b.content_hash
    )
    SELECT n.item_index FROM job_items n JOIN lent ON lent.content_hash = n.content_hash
    WHERE n.job_id = :job""")

# The outputs read once, streamed into the INSERT: the base's rows are read here only
# (a hash that lent's DISTINCT ON took from a failed duplicate, where another one
# succeeded, is not copied: its item is computed). received_at is the job's created_at,
# as for its computed items: with the request id it is the row's key, so a second copy
# (a publish taken over) or a computed row of the same item inserts nothing.
_COPY = text("""
    WITH lent AS (
        SELECT DISTINCT ON (b.content_hash) b.content_hash, b.request_id
        FROM job_items b
        WHERE b.job_id = :base AND b.content_hash IS NOT NULL
        ORDER BY b.content_hash
    ), matched AS (
        SELECT n.request_id, n.item_index, lent.request_id AS source
        FROM job_items n JOIN lent ON lent.content_hash = n.content_hash
        WHERE n.job_id = :job
    )
    INSERT INTO requests (request_id, tenant_id, priority, model, model_version, params,
                          status, output, output_vector, attempts, job_id, item_index,
                          received_at)
    SELECT m.request_id, :tenant, :priority, :model, :version, CAST(:params AS jsonb),
           'succeeded', r.output, r.output_vector, 0, :job, m.item_index, :created_at
    FROM matched m JOIN requests r ON r.request_id = m.source
    WHERE r.job_id = :base AND r.tenant_id = :tenant AND r.status = 'succeeded'
    ON CONFLICT DO NOTHING
    RETURNING item_index""")

_JOB = text(
    "SELECT base_job_id, tenant_id, model, model_version, params::text AS params, created_at "
    "FROM jobs WHERE job_id = :job"
)
_REUSED = text("UPDATE jobs SET reused = reused + :n WHERE job_id = :job")
# Counted as a results writer's rows are (results/jobs.py), in one row: every copied row
# is of the job's current attempt and succeeded.
_COUNT = text("""
    INSERT INTO job_counts AS c (job_id, attempt, writer, succeeded)
    SELECT job_id, attempt, :writer, :n FROM jobs WHERE job_id = :job
    ON CONFLICT (job_id, attempt, writer)
    DO UPDATE SET succeeded = c.succeeded + excluded.succeeded""")

# Memory for the statements' sorts and hashes (narrow rows: ~100 bytes an item), so a
# base of up to ~500,000 items matches in memory; a larger one spills to disk, correctly.
_WORK_MEM = "64MB"
# The new job's items were COPYed moments ago, so the planner's statistics know none of
# them (and often none of a base COPYed minutes ago either): it expected one row on each
# side and joined them in a nested loop, re-reading the base's 200,000 results for each
# of 200,000 new items (quadratic: minutes). Every join here is a bulk one, which hash
# joins do in time linear in the two jobs.
_BULK_JOINS = ("SET LOCAL enable_nestloop = off", f"SET LOCAL work_mem = '{_WORK_MEM}'")

# The copy counts its rows as a results writer of its own (results/jobs.py): one id a
# job, so a second copy adds to the same counts row (it inserts, and counts, nothing).
_WRITERS = uuid.UUID("6c1b1d0e-2f0a-4f4e-9a57-0c5e2b7a9d31")


def copy_writer(job_id: str) -> str:
    return str(uuid.uuid5(_WRITERS, job_id))


async def match_reusable(
    conn: AsyncConnection, *, job_id: str, base_job_id: str, tenant_id: str
) -> frozenset[int]:
    """The indexes of the new job's items (already COPYed, in the caller's transaction)
    that the base can lend a result to. Nothing is written."""
    for stmt in _BULK_JOINS:
        await conn.execute(text(stmt))
    rows = await conn.execute(_MATCH, {"job": job_id, "base": base_job_id, "tenant": tenant_id})
    matched = frozenset(r[0] for r in rows)
    for name in ("enable_nestloop", "work_mem"):  # the rest of the transaction as usual
        await conn.execute(text(f"RESET {name}"))
    return matched


def copy_reused(engine: Engine, job_id: str) -> frozenset[int]:
    """Copy the base's results to the job's matching items that have no row yet, count
    them, and settle the job (it may be finished now); the indexes copied by this call.
    Nothing for a job with no base."""
    with engine.begin() as conn:
        job = conn.execute(_JOB, {"job": job_id}).first()
        if job is None or job.base_job_id is None:
            return frozenset()
        for stmt in _BULK_JOINS:
            conn.execute(text(stmt))
        copied = frozenset(r[0] for r in conn.execute(_COPY, _copy_params(job_id, job)))
        if copied:
            conn.execute(_REUSED, {"n": len(copied), "job": job_id})
            conn.execute(_COUNT, {"n": len(copied), "job": job_id, "writer": copy_writer(job_id)})
    with engine.begin() as conn, _cursor(conn) as cur:
        settle(cur, [job_id])  # after the counts committed (see results/jobs.py)
    return copied


def _copy_params(job_id: str, job: Any) -> dict[str, Any]:
    return {
        "job": job_id,
        "base": str(job.base_job_id),
        "tenant": str(job.tenant_id),
        "priority": str(PriorityClass.JOBS),
        "model": job.model,
        "version": job.model_version,
        "params": job.params,
        "created_at": job.created_at,
    }


def _cursor(conn: Connection) -> Any:
    """The driver's cursor in ``conn``'s transaction: the results writers' statements
    are plain psycopg SQL (binary arrays)."""
    return conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
