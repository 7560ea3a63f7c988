"""The request messages the API puts in Kafka, made in one place. Pure.

A message carries everything the scheduler needs without a database lookup
(core/messages.py): who sent it (tenant, priority class, weight), the resolved model
version, what the model takes, when it arrived and when its caller stops waiting. A
front door's request becomes one with ``request_message``; a job item with
``job_item_message``.
"""

from __future__ import annotations

from typing import Any

import orjson

from core.messages import RequestMessage, body_hash
from core.models.spec import ModelSpec
from core.vocab import TIER_TO_CLASS, PriorityClass
from results.tenants import Tenant


def request_message(
    spec: ModelSpec,
    input_: Any,
    params: dict[str, Any],
    *,
    tenant: Tenant,
    request_id: str,
    received: float,
    timeout_ms: int,
    idempotency_key: str | None,
    tier: str | None = None,
) -> RequestMessage:
    """The message of one accepted input. ``tier``: the tier it is scheduled in (a
    client may lower its priority, never raise it: kserve/wire.py); else the key's."""
    return RequestMessage(
        request_id=request_id,
        tenant_id=tenant.id,
        priority=TIER_TO_CLASS[tier or tenant.tier],
        model=spec.name,
        version=spec.version,
        input=spec.message_input(input_),  # token ids too, where the model takes them
        params=params,
        deadline=received + timeout_ms / 1000,
        received_at=received,
        # Only an Idempotency-Key needs the fingerprint; skip the hashing otherwise.
        body_hash=body_hash(spec.ref, input_, params) if idempotency_key else "",
        weight=tenant.weight,
    )


def job_item_message(
    job: Any, *, job_id: str, index: int, value: str | bytes, request_id: str, job_attempt: int
) -> RequestMessage:
    """The message of one job item: ``job`` is its job's row
    (results/job_submission.py ``job_to_publish``), ``value`` the item's input as the
    JSON it was staged as (written as it is)."""
    return RequestMessage(
        request_id=request_id,
        tenant_id=str(job.tenant_id),
        priority=PriorityClass.JOBS,
        model=job.model,
        version=job.model_version,
        input=orjson.Fragment(value),
        params=job.params,
        deadline=job.expires_at.timestamp(),  # the completion window
        received_at=job.created_at.timestamp(),
        job_id=job_id,
        item_index=index,
        job_attempt=job_attempt,
        weight=job.weight,
    )
