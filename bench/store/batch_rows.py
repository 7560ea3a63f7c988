"""Request-log rows as the scheduler builds them (scheduler/runtime/rows.py), made ahead for
the store benchmarks and the tests that write rows without a scheduler."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from core.vocab import RequestStatus
from results.schema import RequestRow


def request_row(tenant: str, at: datetime, **kw: Any) -> RequestRow:
    """A succeeded sync request of ``tenant`` received at ``at`` (an embedding's vector),
    with ``kw`` over any of its keys."""
    r: RequestRow = {
        "request_id": str(uuid.uuid4()),
        "tenant_id": tenant,
        "priority": "paid",
        "model": "all-minilm-l6-v2",
        "model_version": "1",
        "params": {"normalize": True},
        "input": "a sentence",
        "status": RequestStatus.SUCCEEDED,
        "output": None,
        "output_vector": bytes(range(16)) * 96,
        "error": None,
        "attempts": 1,
        "batch_id": None,
        "batch_size": 1,
        "job_id": None,
        "item_index": None,
        "received_at": at,
        "produced_at": at,
        "consumed_at": at,
        "batched_at": at,
        "compute_start_at": at,
        "compute_end_at": at,
        "deadline_at": at + timedelta(seconds=1),
        "kafka_topic": "t",
        "kafka_partition": 0,
        "kafka_offset": 0,
        "service_tier": "default",
    }
    r.update(kw)  # type: ignore[typeddict-item]
    return r


def batch_rows(vecs: list[bytes], tenant: str, at: datetime) -> list[RequestRow]:
    """One batch as the scheduler builds it (scheduler/runtime/rows.py) for an embedding model."""
    batch_id = str(uuid.uuid4())
    rows: list[RequestRow] = []
    for i, vec in enumerate(vecs):
        rows.append(
            request_row(
                tenant,
                at + timedelta(microseconds=i),
                priority="jobs",
                input=None,
                output_vector=vec,
                batch_id=batch_id,
                batch_size=len(vecs),
                kafka_topic="gristmill.requests.jobs",
                kafka_offset=i,
                service_tier=None,
            )
        )
    return rows
