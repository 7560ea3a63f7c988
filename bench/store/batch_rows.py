"""Request-log rows of an embedding batch as the scheduler builds them (scheduler/runtime/rows.py),
made ahead for the store benchmarks that write without a scheduler."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from core.vocab import RequestStatus
from results.schema import RequestRow


def batch_rows(vecs: list[bytes], tenant: str, at: datetime) -> list[RequestRow]:
    """One batch as the scheduler builds it (scheduler/runtime/rows.py) for an embedding model."""
    batch_id = str(uuid.uuid4())
    rows: list[RequestRow] = []
    for i, vec in enumerate(vecs):
        t = at + timedelta(microseconds=i)
        rows.append(
            {
                "request_id": str(uuid.uuid4()),
                "tenant_id": tenant,
                "priority": "jobs",
                "model": "all-minilm-l6-v2",
                "model_version": "1",
                "params": {"normalize": True},
                "input": None,
                "status": RequestStatus.SUCCEEDED,
                "output": None,
                "output_vector": vec,
                "error": None,
                "attempts": 1,
                "batch_id": batch_id,
                "batch_size": len(vecs),
                "job_id": None,
                "item_index": None,
                "received_at": t,
                "produced_at": t,
                "consumed_at": t,
                "batched_at": t,
                "compute_start_at": t,
                "compute_end_at": t,
                "deadline_at": t + timedelta(seconds=1),
                "kafka_topic": "gristmill.requests.jobs",
                "kafka_partition": 0,
                "kafka_offset": i,
                "service_tier": None,
            }
        )
    return rows
