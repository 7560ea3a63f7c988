"""Load reports: schedulers say what they can do and what waits; API instances
say they are alive. Ingest turns these into admission decisions and rate shares."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    CompoundSelect,
    Connection,
    Row,
    Select,
    delete,
    func,
    literal,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from core.load_report import LoadReport
from results.schema import api_instances, scheduler_load


def report_scheduler(conn: Connection, scheduler_id: str, report: LoadReport) -> None:
    stmt = insert(scheduler_load).values(
        scheduler_id=scheduler_id,
        capacity=report.capacity,
        backlog=report.backlog,
        lag=report.lag,
        tenant_backlog=report.tenants,
        kv=report.kv,
    )
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["scheduler_id"],
            set_={
                "capacity": stmt.excluded.capacity,
                "backlog": stmt.excluded.backlog,
                "lag": stmt.excluded.lag,
                "tenant_backlog": stmt.excluded.tenant_backlog,
                "kv": stmt.excluded.kv,
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
        scheduler_load.c.kv,
        func.extract("epoch", func.now() - scheduler_load.c.updated_at).label("age_s"),
    ).where(
        scheduler_load.c.updated_at > func.now() - func.make_interval(0, 0, 0, 0, 0, 0, stale_s),
        scheduler_load.c.scheduler_id.startswith(process_id(deployment, ""), autoescape=True),
    )


def report_of(row: Row[Any]) -> LoadReport:
    """A row of ``live_reports_stmt`` as the report its scheduler wrote."""
    return LoadReport(row.capacity, row.backlog, row.lag, row.tenant_backlog, row.kv)


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


# ---- each process's metrics window, for the dashboard (decision 33) ----------------------
def publish_scheduler_metrics(conn: Connection, scheduler_id: str, metrics: dict[str, Any]) -> None:
    """Beside the load report (written just before, in the same transaction)."""
    conn.execute(
        update(scheduler_load)
        .where(scheduler_load.c.scheduler_id == scheduler_id)
        .values(metrics=metrics)
    )


def publish_api_metrics_stmt(instance_id: str, metrics: dict[str, Any]) -> Any:
    """Beside the instance's heartbeat; inserts the row if the heartbeat has not yet."""
    stmt = insert(api_instances).values(instance_id=instance_id, metrics=metrics)
    return stmt.on_conflict_do_update(
        index_elements=["instance_id"],
        set_={"metrics": stmt.excluded.metrics, "last_seen_at": func.now()},
    )


def live_metrics_stmt(stale_s: float, deployment: str) -> CompoundSelect:
    """The metrics windows of every live scheduler and API process of the deployment:
    (kind "scheduler" or "api", process id, metrics)."""
    prefix = process_id(deployment, "")
    fresh = func.now() - func.make_interval(0, 0, 0, 0, 0, 0, stale_s)

    def live(kind: str, process: Any, seen: Any, metrics: Any) -> Select[Any]:
        return select(literal(kind).label("kind"), process.label("process"), metrics).where(
            seen > fresh, process.startswith(prefix, autoescape=True)
        )

    s, a = scheduler_load.c, api_instances.c
    schedulers = live("scheduler", s.scheduler_id, s.updated_at, s.metrics)
    return schedulers.union_all(live("api", a.instance_id, a.last_seen_at, a.metrics))


async def live_metrics(engine: AsyncEngine, stale_s: float, deployment: str) -> list[Any]:
    """``live_metrics_stmt``'s rows: (kind, process, metrics)."""
    async with engine.connect() as conn:
        return list((await conn.execute(live_metrics_stmt(stale_s, deployment))).all())
