"""One row of the request log as the scheduler builds it and results/ stores it.

The shape crosses a stage boundary (the scheduler's pure core builds a failed row for a
message it cannot read; results/store.py writes rows), so it lives below both. The
table it fills is results/schema.py ``requests``, which checks the two agree at import.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NotRequired, TypedDict

from core.vocab import RequestStatus


class RequestRow(TypedDict):
    """One row of ``requests`` as the scheduler writes it: every column but
    ``persisted_at``, which the database stamps. Checked against the table in
    results/schema.py."""

    request_id: str
    tenant_id: str
    priority: str
    model: str
    model_version: str
    params: dict[str, Any]
    input: Any
    status: RequestStatus
    output: Any
    output_vector: bytes | None
    error: str | None
    attempts: int
    batch_id: str | None
    batch_size: int | None
    job_id: str | None
    item_index: int | None
    received_at: datetime
    produced_at: datetime | None
    consumed_at: datetime | None
    batched_at: datetime | None
    compute_start_at: datetime | None
    compute_end_at: datetime | None
    deadline_at: datetime | None
    kafka_topic: str | None
    kafka_partition: int | None
    kafka_offset: int | None
    service_tier: str | None  # flex | default | priority; None: a job item (decision 66)
    # Not a column: where its answer is announced (the waiting API process's channel,
    # decision 70); absent: the shared channel.
    reply_to: NotRequired[str]


# RequestRow's keys that are not columns of ``requests``.
NOT_STORED = frozenset({"reply_to"})
