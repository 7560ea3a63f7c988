"""A backlog put straight into Kafka, as API instances would after accepting it, and
what the request log and the load reports say of it (tests/e2e/test_policy.py,
tests/e2e/test_flex.py)."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Producer
from sqlalchemy import func, select

from core.kafka import producer_config
from core.messages import RequestMessage
from core.topics import request_topic
from gristmill.devservices.stack import System
from results.db import make_engine
from results.schema import requests, scheduler_load
from results.tenants import create_tenant


def new_tenant_id(system: System, tier: str) -> str:
    with make_engine(system.settings.database_url).begin() as conn:
        return create_tenant(conn, f"{tier}-{uuid.uuid4().hex[:8]}", tier).id


def done_count(system: System, tenant_id: str) -> int:
    with make_engine(system.settings.database_url).connect() as conn:
        return int(
            conn.execute(
                select(func.count()).select_from(requests).where(requests.c.tenant_id == tenant_id)
            ).scalar_one()
        )


def queued_paid(system: System) -> int:
    with make_engine(system.settings.database_url).connect() as conn:
        rows = conn.execute(select(scheduler_load.c.backlog)).all()
    return sum(int(r.backlog.get("sim@1", {}).get("paid", 0)) for r in rows)


def burst_into_kafka(
    system: System, tenant_id: str, n: int, fairness_id: str | None = None
) -> None:
    """``n`` paid requests of one tenant put straight into Kafka, as API instances would
    after accepting them (nobody waits on them; they run and are persisted), of the flow
    ``fairness_id`` inside the tenant (none: its default flow)."""
    settings = system.settings  # (rebuilt on each access: read it once)
    topic = request_topic(settings, "paid")
    producer = Producer(producer_config(settings, **{"linger.ms": 20}))
    now = time.time()
    for i in range(n):
        msg = RequestMessage(
            request_id=str(uuid.uuid4()),
            tenant_id=tenant_id,
            priority="paid",
            model="sim",
            version="1",
            input=f"burst {i}",
            params={"salt": ""},
            deadline=now + 120,
            received_at=now,
            fairness_id=fairness_id,
        )
        producer.produce(topic, value=msg.encode(), key=msg.request_id)
    assert producer.flush(30) == 0, "the burst did not all reach Kafka"
