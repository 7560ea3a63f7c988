"""Load reports: schedulers say what they can do and what waits; API instances
say they are alive. Ingest turns these into admission decisions and rate shares."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Select, delete, func, select
from sqlalchemy.dialects.postgresql import insert

from results.schema import api_instances, scheduler_load

# In a tenant backlog, the entry that sums the tenants too small to name.
REST = "*"


def report_scheduler(
    conn: Connection,
    scheduler_id: str,
    capacity: dict[str, float],
    backlog: dict[str, dict[str, int]],
    lag: dict[str, int],
    tenant_backlog: dict[str, dict[str, dict[str, list[float]]]] | None = None,
) -> None:
    stmt = insert(scheduler_load).values(
        scheduler_id=scheduler_id,
        capacity=capacity,
        backlog=backlog,
        lag=lag,
        tenant_backlog=tenant_backlog or {},
    )
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["scheduler_id"],
            set_={
                "capacity": stmt.excluded.capacity,
                "backlog": stmt.excluded.backlog,
                "lag": stmt.excluded.lag,
                "tenant_backlog": stmt.excluded.tenant_backlog,
                "updated_at": func.now(),
            },
        )
    )


def forget_scheduler(conn: Connection, scheduler_id: str) -> None:
    conn.execute(scheduler_load.delete().where(scheduler_load.c.scheduler_id == scheduler_id))


def process_id(deployment: str, name: str) -> str:
    """Ids are "<deployment>:<process>": deployments (topic prefixes) sharing one database
    never count each other's schedulers or API instances."""
    return f"{deployment}:{name}"


def live_reports_stmt(stale_s: float, deployment: str) -> Select[Any]:
    return select(
        scheduler_load.c.capacity,
        scheduler_load.c.backlog,
        scheduler_load.c.lag,
        scheduler_load.c.tenant_backlog,
        func.extract("epoch", func.now() - scheduler_load.c.updated_at).label("age_s"),
    ).where(
        scheduler_load.c.updated_at > func.now() - func.make_interval(0, 0, 0, 0, 0, 0, stale_s),
        scheduler_load.c.scheduler_id.startswith(process_id(deployment, ""), autoescape=True),
    )


def heartbeat_stmt(instance_id: str) -> Any:
    stmt = insert(api_instances).values(instance_id=instance_id)
    return stmt.on_conflict_do_update(
        index_elements=["instance_id"], set_={"last_seen_at": func.now()}
    )


def leave_stmt(instance_id: str) -> Any:
    """An instance shutting down stops counting at once, not after the stale window
    (until then its peers would halve their rate limits and double-count admissions)."""
    return delete(api_instances).where(api_instances.c.instance_id == instance_id)


def live_instances_stmt(stale_s: float, deployment: str) -> Select[Any]:
    return (
        select(func.count())
        .select_from(api_instances)
        .where(
            api_instances.c.last_seen_at
            > func.now() - func.make_interval(0, 0, 0, 0, 0, 0, stale_s),
            api_instances.c.instance_id.startswith(process_id(deployment, ""), autoescape=True),
        )
    )
