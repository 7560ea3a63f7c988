"""Reading the request log: a finished request's row, as the API answers it."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from results.schema import requests

# The columns an answer is built from (ingest/native/routes.py's result_body).
RESULT_COLUMNS = (
    requests.c.request_id,
    requests.c.status,
    requests.c.output,
    requests.c.output_vector,  # a vector output's float32 bytes (results/vectors.py)
    requests.c.error,
    requests.c.model,
    requests.c.model_version,
    requests.c.batch_size,
    requests.c.received_at,
    requests.c.consumed_at,
    requests.c.batched_at,
    requests.c.compute_start_at,
    requests.c.compute_end_at,
    requests.c.persisted_at,
)


async def fetch_request(
    engine: AsyncEngine, tenant_id: str, request_id: str
) -> dict[str, Any] | None:
    """The tenant's finished request ``request_id`` (canonical UUID text), or None: not
    finished, or another tenant's (which the caller must not learn exists)."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                select(*RESULT_COLUMNS).where(
                    requests.c.request_id == request_id, requests.c.tenant_id == tenant_id
                )
            )
        ).first()
    return None if row is None else dict(row._mapping)
