"""How long a fault hurt, measured from what actually happened (not from probes):

* ``partitions_s``: until every partition carrying load has persisted a result
  for a request received after the fault (so a killed scheduler's partitions
  are being processed again by someone);
* ``apis_s``: until every API instance has answered a request sent after the
  fault with 200;
* ``back_s``: until the killed component itself is serving again.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from sqlalchemy import Engine, func, select

from gristmill.chaos.faults import Fault
from gristmill.chaos.ledger import Ledger
from gristmill.chaos.rig import Rig
from results.schema import requests


def first_persist_per_partition(
    engine: Engine, tenant_ids: list[str], since: float
) -> dict[tuple[str, int], float]:
    stmt = (
        select(
            requests.c.kafka_topic, requests.c.kafka_partition, func.min(requests.c.persisted_at)
        )
        .where(
            requests.c.tenant_id.in_(tenant_ids),
            requests.c.received_at >= datetime.fromtimestamp(since, tz=UTC),
        )
        .group_by(requests.c.kafka_topic, requests.c.kafka_partition)
    )
    with engine.connect() as conn:
        return {(t, p): at.timestamp() for t, p, at in conn.execute(stmt)}


def first_ok_per_api(ledger: Ledger, since: float) -> dict[int, float]:
    out: dict[int, float] = {}
    for o in ledger.snapshot():
        if o.status == 200 and o.sent_at >= since:
            out[o.api] = min(out.get(o.api, o.done_at), o.done_at)
    return out


def measure(
    fault: Fault, rig: Rig, engine: Engine, ledger: Ledger, tenant_ids: list[str], timeout_s: float
) -> None:
    """Fill in the fault's recovery times, waiting at most ``timeout_s`` for them."""
    t0 = fault.injected_at
    want_parts = rig.loaded_partitions()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if fault.back_s is None and not _target_down(rig, fault):
            fault.back_s = time.time() - t0
        if fault.apis_s is None:
            firsts = first_ok_per_api(ledger, t0)
            if len(firsts) == len(rig.apis):
                fault.apis_s = max(firsts.values()) - t0
        if fault.partitions_s is None:
            try:
                parts = first_persist_per_partition(engine, tenant_ids, t0)
            except Exception:  # PostgreSQL itself may still be on its way back
                parts = {}
            if want_parts <= set(parts):
                fault.partitions_s = max(parts[tp] for tp in want_parts) - t0
        if None not in (fault.back_s, fault.apis_s, fault.partitions_s):
            return
        time.sleep(0.25)


def _target_down(rig: Rig, fault: Fault) -> bool:
    target = fault.target.split("/")[0]
    return target in rig.not_ready()
