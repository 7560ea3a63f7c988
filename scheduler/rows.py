"""Turning finished requests into request-log rows. Pure."""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import Any

from results.db import ts
from scheduler.batcher import Batch, Pending
from workers.models.token_ids import input_text


@lru_cache(maxsize=64)
def _batch_ts(epoch_s: float | None) -> datetime | None:
    """A batch's times repeat on each of its rows: convert them once."""
    return ts(epoch_s)


def request_row(
    p: Pending,
    *,
    status: str,
    output: Any = None,
    error: str | None = None,
    batch: Batch | None = None,
    compute_start: float | None = None,
    compute_end: float | None = None,
) -> dict[str, Any]:
    m = p.msg
    return {
        "request_id": m.request_id,
        "tenant_id": m.tenant_id,
        "priority": m.priority,
        "model": m.model,
        "model_version": m.version,
        "params": m.params,
        # Job items keep theirs in job_items; a tokenized input is stored as its text.
        "input": None if m.job_id else input_text(m.input),
        "status": status,
        "output": output,
        "error": error,
        "attempts": m.attempt + 1,
        "batch_id": batch.batch_id if batch else None,
        "batch_size": len(batch.items) if batch else None,
        "job_id": m.job_id,
        "item_index": m.item_index,
        "received_at": ts(m.received_at),
        "produced_at": ts(m.extra.get("produced_at")),
        "consumed_at": ts(p.consumed_at),
        "batched_at": _batch_ts(batch.formed_at) if batch else None,
        "compute_start_at": _batch_ts(compute_start),
        "compute_end_at": _batch_ts(compute_end),
        "deadline_at": ts(m.deadline),
        "kafka_topic": p.tp[0],
        "kafka_partition": p.tp[1],
        "kafka_offset": p.offset,
    }


def batch_row(
    batch: Batch,
    *,
    worker_id: str,
    status: str,
    error: str | None,
    compute_start: float | None,
    compute_end: float | None,
) -> dict[str, Any]:
    return {
        "batch_id": batch.batch_id,
        "model": batch.key.model,
        "model_version": batch.key.version,
        "batch_key": batch.key.label(),
        "size": len(batch.items),
        "reason": batch.reason,
        "worker_id": worker_id,
        "status": status,
        "error": error,
        "formed_at": ts(batch.formed_at),
        "compute_start_at": ts(compute_start),
        "compute_end_at": ts(compute_end),
        "compute_ms": (compute_end - compute_start) * 1000
        if compute_start and compute_end
        else None,
    }
