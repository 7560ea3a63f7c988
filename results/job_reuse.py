"""An incremental job's reused results (decision 61), written in its submission's
transaction: each new item whose content hash matches a succeeded item of the base job
gets a result row of its own (the base's output copied, status succeeded, ``attempts``
0); it is never sent to Kafka. That row is the item's mark: no computed attempt is
ever recorded with ``attempts`` 0 (a computed row holds attempt + 1), so ``reused`` is
read from it (``results/job_items.py``) and ``job_items`` is not written a second time.

A copy, not a pointer: every reader, the retry, the sweeper's output expiry and the
request log's retention keep treating the new job's rows as its own, and the base job
may expire or be deleted without touching the new one.
"""

from __future__ import annotations

from typing import Any

import orjson
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from core.vocab import PriorityClass

# Matched on narrow rows first (hash and request id: ~100 bytes an item), the outputs
# (1.5 KB for a 384-float embedding) read once, streamed into the INSERT: carrying them
# through the sort and the hash spilled 300 MB to disk twice for a 200,000-item base.
# A base item's result is the row of its *current* attempt (job_items.request_id), read
# within the base job ((job_id, item_index) index per partition) whatever the log's size.
# DISTINCT ON: a base holding one input twice lends one of them (computed again if that
# one did not succeed). The tenant is in the content hash and checked again here.
# received_at is the transaction's now(), the new job's created_at (its items' time).
_REUSE = text("""
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
           'succeeded', r.output, r.output_vector, 0, :job, m.item_index, now()
    FROM matched m JOIN requests r ON r.request_id = m.source
    WHERE r.job_id = :base AND r.tenant_id = :tenant AND r.status = 'succeeded'
    RETURNING item_index""")
# Memory for this statement's sort and hashes (narrow rows: ~100 bytes an item), so a
# base of up to ~500,000 items matches in memory; a larger one spills to disk, correctly.
_WORK_MEM = "64MB"


async def reuse_results(
    conn: AsyncConnection,
    *,
    job_id: str,
    base_job_id: str,
    tenant_id: str,
    model: str,
    version: str,
    params: dict[str, Any],
) -> frozenset[int]:
    """Copy the base job's results to the new job's matching items (already COPYed, in
    the caller's transaction); the indexes of the items that were reused."""
    # The new job's items were COPYed in this transaction, so the planner's statistics
    # know none of them (and often none of a base COPYed minutes ago either): it
    # expected one row on each side and joined them in a nested loop, re-reading the
    # base's 200,000 results for each of 200,000 new items (quadratic: minutes). Every
    # join here is a bulk one, which hash joins do in time linear in the two jobs.
    await conn.execute(text("SET LOCAL enable_nestloop = off"))
    await conn.execute(text(f"SET LOCAL work_mem = '{_WORK_MEM}'"))
    rows = await conn.execute(
        _REUSE,
        {
            "job": job_id,
            "base": base_job_id,
            "tenant": tenant_id,
            "priority": str(PriorityClass.JOBS),
            "model": model,
            "version": version,
            "params": orjson.dumps(params).decode(),
        },
    )
    reused = frozenset(r[0] for r in rows)
    for name in ("enable_nestloop", "work_mem"):  # the rest of the transaction as usual
        await conn.execute(text(f"RESET {name}"))
    return reused
