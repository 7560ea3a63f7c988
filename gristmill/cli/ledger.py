"""``gristmill ledger``: run the durability ledger, export a tenant's account of a period
(decision 54)."""

from __future__ import annotations

import json
import signal
import threading
import uuid
from datetime import UTC, datetime, timedelta
from types import FrameType

import typer

from core.config import load_settings

app = typer.Typer(
    help="The durability ledger: accepted requests reconciled against terminal rows.",
    no_args_is_help=True,
)

MINUTE = timedelta(minutes=1)


def tenant_id(value: str) -> str:
    """A tenant id is a UUID; anything else is refused by name, before any query."""
    try:
        return str(uuid.UUID(value.strip()))
    except (ValueError, AttributeError):
        shown = value if len(value) <= 60 else value[:60] + "..."
        raise typer.BadParameter(f"not a tenant id (a UUID): {shown!r}") from None


def instant(value: str, option: str = "") -> datetime:
    """An ISO 8601 time; one without a zone is UTC."""
    try:
        t = datetime.fromisoformat(value.strip())
    except ValueError:
        shown = value if len(value) <= 60 else value[:60] + "..."
        raise typer.BadParameter(
            f"not an ISO 8601 time (e.g. 2026-11-27T15:00:00Z): {shown!r}", param_hint=option
        ) from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def whole_minutes(since: datetime, until: datetime) -> tuple[datetime, datetime]:
    """The ledger counts by minute of received time: the period widens to whole minutes."""
    lo = since.replace(second=0, microsecond=0)
    hi = until.replace(second=0, microsecond=0)
    return lo, hi if hi == until else hi + MINUTE


@app.command()
def run() -> None:
    """Run the reconciler (its own consumer group; stops in order on SIGTERM/SIGINT)."""
    import logging

    from core import redact
    from gristmill.ledger import metrics
    from gristmill.ledger.reconciler import Reconciler

    logging.basicConfig(level="INFO", format="%(asctime)s %(name)s %(levelname)s %(message)s")
    redact.install()
    settings = load_settings()
    stop = threading.Event()

    def on_signal(_sig: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    metrics.serve(settings.metrics_host, settings.ledger_metrics_port)
    Reconciler(settings).run(stop)


@app.command()
def export(
    tenant: str = typer.Option(..., help="the tenant's id (a UUID)", callback=tenant_id),
    since: str = typer.Option(..., help="ISO 8601 start (received time; no zone: UTC)"),
    until: str = typer.Option(..., help="ISO 8601 end, exclusive"),
) -> None:
    """A tenant's requests received in [since, until), as JSON: accepted, terminal,
    missing (0 unless something was lost), pending (read, not reconciled yet), and
    whether the period is complete (the ledger has read past it)."""
    from sqlalchemy.exc import SQLAlchemyError

    from gristmill.ledger.policy import complete
    from gristmill.ledger.reconciler import ledger_group
    from results import ledger as sql
    from results.db import make_engine

    lo_t, hi_t = instant(since, "--since"), instant(until, "--until")
    if lo_t >= hi_t:
        raise typer.BadParameter(
            f"--since ({since}) must be before --until ({until})", param_hint="--since"
        )
    try:
        lo, hi = whole_minutes(lo_t, hi_t)
    except OverflowError:  # the last minute of year 9999
        raise typer.BadParameter(f"out of range: {until!r}", param_hint="--until") from None
    settings = load_settings()
    group = ledger_group(settings)
    engine = make_engine(settings.database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            e = sql.export(conn, group, tenant, lo, hi)
    except SQLAlchemyError as exc:
        typer.secho(
            f"cannot read the ledger ({type(exc).__name__}): is DATABASE_URL right, the "
            "database up and migrated (gristmill migrate)?",
            fg="red",
            err=True,
        )
        raise typer.Exit(1) from None
    finally:
        engine.dispose()
    out = {
        "tenant": tenant,
        "since": lo.isoformat(),
        "until": hi.isoformat(),
        "accepted": e.accepted,
        "terminal": e.terminal,
        "missing": e.missing,
        "pending": e.pending,
        "duplicates": e.duplicate,
        "complete": complete(e.settled_through, hi.timestamp(), settings.produce_timeout_ms / 1000),
        "missing_request_ids": e.missing_ids,
    }
    typer.echo(json.dumps(out))
