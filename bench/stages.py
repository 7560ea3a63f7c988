"""Where requests' time went, per stage, from the request log (PostgreSQL)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from gristmill.devservices.stack import System
from results.db import make_engine

STAGES = {
    "queue": ("received_at", "consumed_at"),  # API accepted -> scheduler read it from Kafka
    "batch_wait": ("consumed_at", "batched_at"),
    "dispatch": ("batched_at", "compute_start_at"),
    "compute": ("compute_start_at", "compute_end_at"),
    "persist": ("compute_end_at", "persisted_at"),
}


def stage_percentiles(
    system: System,
    t0: float,
    t1: float,
    *,
    priority: str | None = None,
    tenant_id: str | None = None,
) -> dict[str, dict[str, float]]:
    """p50/p95 ms of each stage for the requests received in [t0, t1] (epoch s)."""
    cols = ", ".join(
        f"percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY "
        f"extract(epoch FROM {b} - {a}) * 1000) AS {name}"
        for name, (a, b) in STAGES.items()
    )
    where = ["received_at BETWEEN to_timestamp(:t0) AND to_timestamp(:t1)"]
    args: dict[str, Any] = {"t0": t0, "t1": t1}
    if priority is not None:
        where.append("priority = :priority")
        args["priority"] = priority
    if tenant_id is not None:
        where.append("tenant_id = :tenant")
        args["tenant"] = tenant_id
    with make_engine(system.settings.database_url).connect() as conn:
        row = conn.execute(
            text(f"SELECT {cols} FROM requests WHERE {' AND '.join(where)}"), args
        ).one()
    return {
        name: {"p50_ms": round(v[0], 1), "p95_ms": round(v[1], 1)}
        for name, v in zip(STAGES, row, strict=True)
        if v is not None
    }
