"""Turning finished requests into request-log rows (results/schema.py ``RequestRow``). Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from core.messages import REPLY_TO, service_tier
from core.models.token_ids import input_text
from core.request_row import RequestRow
from core.vocab import RequestStatus
from results.db import is_reply_channel, ts
from results.faults import storable
from results.vectors import is_vector_batch, rows_as_bytes
from scheduler.core.batcher import Batch, Pending
from scheduler.core.charging import batch_shares
from scheduler.core.plans import Write

if TYPE_CHECKING:
    import numpy as np


def request_row(
    p: Pending,
    *,
    status: RequestStatus,
    output: Any = None,
    error: str | None = None,
    batch: Batch | None = None,
    compute_start: float | None = None,
    compute_end: float | None = None,
) -> RequestRow:
    """The request log's row of one finished request."""
    return _rows([p], status, [output], error, batch, compute_start, compute_end)[0]


def write_rows(w: Write) -> tuple[list[RequestRow], dict[str, Any] | None]:
    """The request rows of a planned write, and its batch row if it carries one."""
    batch = w.batch
    if w.status == RequestStatus.SUCCEEDED:
        assert batch is not None and w.outputs is not None and w.compute is not None
        rows = succeeded_rows(batch, w.outputs, *w.compute, items=w.items)
    else:
        rows = _rows(w.items, w.status, [None] * len(w.items), w.error, batch, None, None)
    if not w.batch_row or batch is None:
        return rows, None
    start, end = w.compute or (None, None)
    brow = batch_row(
        batch,
        worker_id=w.worker_id or "",
        status=RequestStatus.SUCCEEDED,
        error=None,
        compute_start=start,
        compute_end=end,
        worker_times=w.worker_times,
    )
    return rows, brow


def unstorable(row: Mapping[str, Any], error: str) -> dict[str, Any]:
    """A row PostgreSQL refused, as a failed row it can hold: every text and JSON value
    made storable (scheduler's copy only: the message itself goes to the dead-letter
    topic unchanged) and the refusal as its error."""
    out = {k: storable(v) if isinstance(v, str | dict | list) else v for k, v in row.items()}
    if "request_id" in out:  # a request row (a batch row keeps its own status)
        out["status"] = RequestStatus.FAILED
        out["error"] = storable(f"the result could not be stored: {error}")
    return out


def succeeded_rows(
    batch: Batch,
    outputs: Sequence[Any] | np.ndarray,
    compute_start: float,
    compute_end: float,
    items: Sequence[Pending] | None = None,
) -> list[RequestRow]:
    """``request_row(p, status=RequestStatus.SUCCEEDED, ...)`` for ``items`` of a computed
    batch (all of them by default), in one pass. An array of outputs (an embedding
    model's) becomes one float32 vector per row, converted for the whole batch at once."""
    items = batch.items if items is None else items
    if len(outputs) != len(items):
        raise ValueError(f"{len(outputs)} outputs for {len(items)} requests")
    vectors: Sequence[bytes | None] | None = None
    if is_vector_batch(outputs):
        vectors, outputs = rows_as_bytes(outputs), [None] * len(items)
    status = RequestStatus.SUCCEEDED
    return _rows(items, status, outputs, None, batch, compute_start, compute_end, vectors)


def _rows(
    items: Sequence[Pending],
    status: RequestStatus,
    outputs: Sequence[Any] | np.ndarray,
    error: str | None,
    batch: Batch | None,
    compute_start: float | None,
    compute_end: float | None,
    vectors: Sequence[bytes | None] | None = None,
) -> list[RequestRow]:
    """The rows of ``items`` (one output each), built in one pass: a scheduler feeding a
    GPU writes tens of thousands a second. What a batch shares is worked out once, and
    times its requests share (consumed in one fetch, produced in the same millisecond)
    are converted once."""
    fromts = datetime.fromtimestamp
    seen: dict[float, datetime] = {}

    def shared(epoch_s: float | None) -> datetime | None:
        if epoch_s is None:
            return None
        d = seen.get(epoch_s)
        if d is None:
            d = seen[epoch_s] = fromts(epoch_s, UTC)
        return d

    batch_id, size = (batch.batch_id, len(batch.items)) if batch else (None, None)
    batched = ts(batch.formed_at) if batch else None
    start, end = ts(compute_start), ts(compute_end)
    rows: list[RequestRow] = []
    replies: dict[str, bool] = {}
    for p, out, vector in zip(items, outputs, vectors or [None] * len(items), strict=True):
        m = p.msg
        row: RequestRow = {
            "request_id": m.request_id,
            "tenant_id": m.tenant_id,
            "priority": m.priority,
            "model": m.model,
            "model_version": m.version,
            "params": m.params,
            # Job items keep theirs in job_items; a tokenized input is stored as text.
            "input": None if m.job_id else input_text(m.input),
            "status": status,
            "output": out,
            "output_vector": vector,
            "error": error,
            "attempts": m.attempt + 1,
            "batch_id": batch_id,
            "batch_size": size,
            "job_id": m.job_id,
            "item_index": m.item_index,
            "received_at": fromts(m.received_at, UTC),
            "produced_at": shared(m.extra.get("produced_at")),
            "consumed_at": shared(p.consumed_at),
            "batched_at": batched,
            "compute_start_at": start,
            "compute_end_at": end,
            "deadline_at": fromts(m.deadline, UTC),
            "kafka_topic": p.tp[0],
            "kafka_partition": p.tp[1],
            "kafka_offset": p.offset,
            "service_tier": service_tier(m.extra),
        }
        reply = m.extra.get(REPLY_TO)
        if type(reply) is str:
            ok = replies.get(reply)
            if ok is None:  # a batch's requests come from a few API processes
                ok = replies[reply] = is_reply_channel(reply)
            if ok:
                row["reply_to"] = reply
        rows.append(row)
    return rows


def batch_row(
    batch: Batch,
    *,
    worker_id: str,
    status: str,
    error: str | None,
    compute_start: float | None,
    compute_end: float | None,
    worker_times: tuple[float | None, float | None] = (None, None),
) -> dict[str, Any]:
    received, launched = worker_times
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
        "worker_received_at": ts(received),
        "launched_at": ts(launched),
        "compute_start_at": ts(compute_start),
        "compute_end_at": ts(compute_end),
        "compute_ms": (compute_end - compute_start) * 1000
        if compute_start and compute_end
        else None,
        # Device ms received and owed per tier and tenant (decision 65), as JSON text
        # (the column's type takes it); a batch that did not compute charges nothing.
        "shares": orjson.dumps(batch_shares(batch), option=orjson.OPT_NON_STR_KEYS).decode()
        if status == "succeeded"
        else None,
    }
