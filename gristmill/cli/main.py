"""``gristmill``: run the processes, manage tenants and keys, migrate."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import typer

from core import redact
from core.config import load_settings
from core.metrics import MULTIPROC_ENV, multiprocess_env
from gristmill.cli.doctor import doctor
from gristmill.cli.jobs import app as jobs_app
from gristmill.cli.ledger import app as ledger_app
from gristmill.cli.models import app as models_app
from gristmill.simulate.cli import simulate as simulate_cmd

app = typer.Typer(
    help="Gristmill: a durable, batching inference front end.",
    no_args_is_help=True,
    add_completion=False,
)
tenants_app = typer.Typer(help="Tenants and their API keys.", no_args_is_help=True)
app.add_typer(tenants_app, name="tenants")
app.add_typer(jobs_app, name="jobs")
app.add_typer(models_app, name="models")
app.add_typer(ledger_app, name="ledger")
app.command("doctor")(doctor)
app.command("simulate")(simulate_cmd)


def _logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    redact.install()  # no password, key or webhook secret in a log line


def _metrics_dir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="gristmill-api-metrics-")


def _fail(message: str) -> None:
    typer.secho(message, fg="red", err=True)
    raise typer.Exit(1)


@app.command()
def migrate(
    topics: bool = typer.Option(True, help="also create the Kafka topics"),
    revision: str = typer.Option(
        "head", help="stop at this revision (an online upgrade runs in two steps: decision 29)"
    ),
) -> None:
    """Apply database migrations (Alembic) and create missing Kafka topics."""
    from core.topics import ensure_topics
    from gristmill.migrate import migrate_database

    settings = load_settings()
    migrate_database(settings, revision)
    typer.echo(f"database schema is at {revision}")
    if topics:
        created = ensure_topics(settings)
        typer.echo(f"kafka topics ready ({len(created)} created)")


@app.command()
def api(
    host: str | None = None,
    port: int | None = None,
    workers: int | None = typer.Option(
        None, help="uvicorn worker processes (default GRISTMILL_API_PROCESSES, 2)"
    ),
    grpc_port: int | None = typer.Option(
        None, help="KServe gRPC port, served by every process (default GRISTMILL_GRPC_PORT; 0: off)"
    ),
) -> None:
    """Run the HTTP API (and KServe's gRPC service, when a gRPC port is set)."""
    import uvicorn

    from core.memory import limit_arenas
    from gristmill.api_processes import serve

    # uvicorn's processes read their settings from the environment: the gRPC service
    # listens where they are told to.
    if grpc_port is not None:
        os.environ["GRISTMILL_GRPC_PORT"] = str(grpc_port)
    if host is not None:
        os.environ["GRISTMILL_API_HOST"] = host
    settings = load_settings()
    _logging()
    # The uvicorn processes share one port, so a scrape lands on any of them: each writes
    # its metrics to a directory that /metrics reads whole, emptied at every start.
    os.environ.update(multiprocess_env(Path(os.environ.get(MULTIPROC_ENV) or _metrics_dir())))
    limit_arenas()  # before uvicorn spawns its processes: they inherit the environment
    config = uvicorn.Config(
        "ingest.main:app",
        host=host or settings.api_host,
        port=port or settings.api_port,
        # X-Forwarded-For/-Proto only from the configured proxies (TLS ends at them).
        proxy_headers=True,
        forwarded_allow_ips=settings.forwarded_allow_ips,
        log_level="warning",
        access_log=False,
    )
    # GRISTMILL_API_OWN_SOCKETS: each process on a socket of its own (decision 73).
    code = serve(config, workers or settings.api_processes, own_sockets=settings.api_own_sockets)
    if code:
        raise typer.Exit(code)


@app.command()
def scheduler(
    workers: int | None = typer.Option(None, help="local worker processes to spawn"),
    models: str | None = typer.Option(
        None, help="models each local worker serves, e.g. sim,all-minilm-l6-v2"
    ),
    socket_dir: Path = typer.Option(Path(".gristmill/run"), help="where the worker socket lives"),
) -> None:
    """Run a scheduler (Kafka consumer group member) with its local workers."""
    from scheduler.runtime.service import SchedulerService

    _logging()
    settings = load_settings()
    svc = SchedulerService(
        settings,
        socket_dir=socket_dir.resolve(),
        n_workers=workers,
        models=models.split(",") if models else None,
    )
    svc.install_signal_handlers()
    svc.run()


@app.command()
def worker(
    socket: list[Path] = typer.Option(
        ..., help="a scheduler's worker socket; repeat it to serve several schedulers"
    ),
    models: str = typer.Option("sim", help="the models it may serve"),
    worker_id: str | None = None,
    preload: bool = typer.Option(
        False,
        help="load the built-in versions of --models before connecting (a worker whose "
        "schedulers have no registry); by default the schedulers say what to load",
    ),
    redial: bool = typer.Option(
        False,
        help="dial a scheduler that went away again until it is back (a supervised host); "
        "by default the worker exits with its last scheduler",
    ),
) -> None:
    """Run one worker (one per GPU) that joins running schedulers of this host."""
    from workers.process import authkey_for, serve

    _logging()
    settings = load_settings()
    schedulers = [(str(s), authkey_for(settings, str(s))) for s in socket]
    serve(settings, schedulers, models.split(","), worker_id, preload=preload, redial=redial)


@app.command()
def host(
    models: str = typer.Option(
        "all-minilm-l6-v2", help="models the host serves (its schedulers and workers)"
    ),
    api_processes: int | None = typer.Option(
        None,
        help="uvicorn processes of the API (default: from cores, GPUs and costs; 0: no "
        "API here, a GPU node behind an API tier of its own)",
    ),
    schedulers: int | None = typer.Option(
        None, help="scheduler processes (default: from cores, GPUs and costs)"
    ),
    workers_per_gpu: int = typer.Option(
        1, help="worker processes sharing each GPU (more split the launch path's CPU)"
    ),
    colocated: bool = typer.Option(
        False, help="Kafka and PostgreSQL run on this host too: leave them their cores"
    ),
    reserve_cores: float = typer.Option(0.0, help="cores kept for something else"),
    costs: Path | None = typer.Option(
        None, help="measured CPU costs per request (JSON, as bench.gpuhost writes them)"
    ),
    port: int | None = typer.Option(None, help="API port (default GRISTMILL_API_PORT)"),
    grpc_port: int | None = typer.Option(
        None, help="KServe gRPC port (default GRISTMILL_GRPC_PORT; 0: off)"
    ),
    run_dir: Path = typer.Option(Path(".gristmill/host"), help="sockets and logs"),
    plan: bool = typer.Option(False, help="print the shape and exit"),
) -> None:
    """Run every process one GPU host needs (API, schedulers, a worker per GPU), shaped
    from its cores, GPUs and measured costs, and restart any that dies."""
    from gristmill.cli.host import load_costs, run_host

    _logging()
    sys.exit(
        run_host(
            models=models,
            run_dir=run_dir.resolve(),
            api_processes=api_processes,
            schedulers=schedulers,
            colocated=colocated,
            reserve_cores=reserve_cores,
            costs=load_costs(costs),
            api_port=port,
            plan_only=plan,
            grpc_port=grpc_port,
            workers_per_gpu=workers_per_gpu,
        )
    )


@tenants_app.command("add")
def tenants_add(
    name: str, tier: str = typer.Option("free", help="free, paid or enterprise")
) -> None:
    """Create a tenant and print its first API key (shown only once)."""
    from core.errors import GristmillError
    from results.db import make_engine
    from results.tenants import create_tenant, issue_key

    with make_engine(load_settings().database_url).begin() as conn:
        try:
            tenant = create_tenant(conn, name, tier)
        except GristmillError as exc:
            _fail(exc.message)
        key_id, key = issue_key(conn, tenant)
    typer.echo(f"tenant {name} ({tier}) created; key id {key_id}", err=True)
    typer.echo(key)


@tenants_app.command("set")
def tenants_set(
    name: str,
    tier: str | None = typer.Option(None, help="free, paid or enterprise"),
    weight: float | None = typer.Option(None, help="fair share inside the tier (default 1)"),
    rate_rps: float | None = typer.Option(None, help="requests/s (default: the tier's)"),
    burst: float | None = typer.Option(None, help="burst size (default: the tier's)"),
    job_items_per_s: float | None = typer.Option(None, help="job items/s (default: the tier's)"),
) -> None:
    """Change a tenant's tier or plan."""
    from core.errors import GristmillError
    from results.db import make_engine
    from results.tenants import set_plan

    with make_engine(load_settings().database_url).begin() as conn:
        try:
            t = set_plan(
                conn,
                name,
                tier=tier,
                weight=weight,
                rate_rps=rate_rps,
                burst=burst,
                job_items_per_s=job_items_per_s,
            )
        except GristmillError as exc:
            _fail(exc.message)
    typer.echo(
        f"{t.name}: tier {t.tier}, weight {t.weight}, rate {t.rate_rps or 'tier'} rps, "
        f"burst {t.burst or 'tier'}, job items {t.job_items_per_s or 'tier'}/s"
    )


@tenants_app.command("retention")
def tenants_retention(
    name: str, days: int = typer.Argument(..., help="days in the request log; 0: the default")
) -> None:
    """How long a tenant's requests stay in the request log."""
    from core.errors import GristmillError
    from results.db import make_engine
    from results.tenants import set_log_retention

    with make_engine(load_settings().database_url).begin() as conn:
        try:
            set_log_retention(conn, name, days or None)
        except GristmillError as exc:
            _fail(exc.message)
    typer.echo(f"{name}: request log retention {days or 'default'} days")


@app.command()
def sweep() -> None:
    """One pass of the sweeper now: partitions made and dropped, expired job outputs,
    short tenant retentions and old idempotency keys deleted (schedulers run it each
    minute; this waits for nothing and refuses while another instance holds it)."""
    import json

    from results.db import make_engine
    from results.sweeper import Sweeper

    _logging("WARNING")
    settings = load_settings()
    sweeper = Sweeper(make_engine(settings.database_url, pool_size=1), settings)
    if not sweeper.try_lead():
        _fail("another instance is sweeping right now; try again in a minute")
    try:
        report = sweeper.sweep()
    finally:
        sweeper.release()
    typer.echo(json.dumps(report.as_dict(), indent=2))


@tenants_app.command("add-key")
def tenants_add_key(
    name: str,
    admin: bool = typer.Option(
        False, help="the key may also reach operator routes (dashboard, model registry)"
    ),
) -> None:
    """Issue another API key for an existing tenant."""
    from core.errors import GristmillError
    from results.db import make_engine
    from results.tenants import get_tenant, issue_key

    with make_engine(load_settings().database_url).begin() as conn:
        try:
            key_id, key = issue_key(conn, get_tenant(conn, name), admin=admin)
        except GristmillError as exc:
            _fail(exc.message)
    typer.echo(f"key id {key_id}" + (" (admin scope)" if admin else ""), err=True)
    typer.echo(key)


@tenants_app.command("list")
def tenants_list() -> None:
    """List tenants with their keys (prefixes only; keys are stored hashed)."""
    from results.db import make_engine
    from results.tenants import list_keys, list_tenants

    with make_engine(load_settings().database_url).connect() as conn:
        keys = list_keys(conn)
        for t in list_tenants(conn):
            typer.echo(f"{t.name}\t{t.tier}\t{t.id}")
            for k in (k for k in keys if k["name"] == t.name):
                state = f"revoked {k['revoked_at']:%Y-%m-%d}" if k["revoked_at"] else "active"
                scope = "  admin" if k["admin"] else ""
                typer.echo(f"    key {k['id']}  {k['prefix']}...  {state}{scope}")


@tenants_app.command("revoke")
def tenants_revoke(key_id: str) -> None:
    """Revoke an API key by its id (see `gristmill tenants list`)."""
    from core.errors import GristmillError
    from results.db import make_engine
    from results.tenants import revoke_key

    with make_engine(load_settings().database_url).begin() as conn:
        try:
            revoke_key(conn, key_id)
        except GristmillError as exc:
            _fail(exc.message)
    typer.echo(f"key {key_id} revoked")


@app.command(
    context_settings={
        "allow_extra_args": True,
        "ignore_unknown_options": True,
        "help_option_names": [],
    }
)
def chaos(ctx: typer.Context) -> None:
    """Chaos suite: load + random faults + audit (see docs/chaos.md; --help for options)."""
    from gristmill.chaos.cli import main as chaos_main

    raise typer.Exit(chaos_main(ctx.args))


@app.command("plan")
def plan_cmd(
    rate: float = typer.Option(..., help="target requests (items) per second"),
    slo_ms: float = typer.Option(..., help="worst-case latency target in milliseconds"),
    model: str = typer.Option("sim", help="model name[@version]"),
    utilization: float = typer.Option(0.75, help="target busy fraction per worker"),
    worker_class: str | None = typer.Option(
        None, help="plan for this worker class's curve (cpu, cuda, ...); default: each class"
    ),
    measure: bool = typer.Option(
        False,
        help="load the model here and measure its curve, "
        "instead of reading what live workers reported",
    ),
) -> None:
    """How many workers (GPUs) a target rate needs within an SLO, from the measured model
    curve of each worker class (a pool of CPU and GPU workers has one curve per class)."""
    from sqlalchemy import select

    from core.models.catalog import build_specs, latest
    from gristmill.planner import plan, render
    from results.db import make_engine
    from results.modelregistry import curves
    from results.schema import models as models_table
    from workers.models.loader import load_model

    settings = load_settings()
    name, _, version = model.partition("@")
    # (label, profile, max batch) per worker class, newest report first
    found: list[tuple[str, dict[int, float], int]] = []
    if not measure:
        try:
            with make_engine(settings.database_url).connect() as conn:
                rows = curves(conn, name, version or None)
                if not rows:  # schedulers from before per-class curves: one blended curve
                    q = select(
                        models_table.c.version,
                        models_table.c.max_batch_size,
                        models_table.c.profile_ms,
                    ).where(models_table.c.name == name)
                    if version:
                        q = q.where(models_table.c.version == version)
                    old = conn.execute(q.order_by(models_table.c.last_seen_at.desc())).first()
                    if old is not None:
                        rows = [
                            {
                                "version": old.version,
                                "worker_class": "any",
                                "profile_ms": old.profile_ms,
                                "max_batch_size": old.max_batch_size,
                            }
                        ]
        except Exception as exc:
            _fail(f"cannot read the model registry ({exc}); use --measure")
        seen: set[str] = set()
        for row in rows:
            cls = row["worker_class"]
            if cls in seen or (worker_class and cls != worker_class) or not row["profile_ms"]:
                continue
            seen.add(cls)
            profile = {int(k): float(v) for k, v in row["profile_ms"].items()}
            label = f"{name}@{row['version']} on {cls} workers"
            found.append((label, profile, row["max_batch_size"]))
            typer.echo(f"using the curve reported by live workers for {label}")
    if not found:
        specs = build_specs(settings)
        if name not in specs:
            _fail(f"no curve reported for {model}; unknown here, so it cannot be measured")
        spec = specs[name][version] if version else latest(specs[name])
        typer.echo(f"measuring {spec.ref} here (warmup) ...", err=True)
        loaded = load_model(spec, settings)
        found.append((f"{spec.ref} measured here", loaded.warmup(), spec.max_batch_size))
    for label, profile, max_batch in found:
        typer.echo(
            render(
                plan(
                    rate=rate,
                    slo_ms=slo_ms,
                    profile=profile,
                    max_batch=max_batch,
                    utilization=utilization,
                    linger_ms=settings.max_linger_ms,
                ),
                label,
            )
        )


@app.command()
def dev(
    state_dir: Path = typer.Option(Path(".gristmill"), help="where services keep their data"),
    port: int = typer.Option(8000, help="API port (0: pick a free one; it is printed)"),
    grpc_port: int = typer.Option(
        0, help="KServe gRPC port (0: pick a free one; -1: off; it is printed)"
    ),
    workers: int = typer.Option(2, help="worker processes"),
    models: str = typer.Option(
        "sim,all-minilm-l6-v2,gristmill-lm",
        help="models the workers serve (every built-in one: all that GET /v1/models lists)",
    ),
) -> None:
    """Start Kafka, PostgreSQL, the API, a scheduler with workers and the durability ledger
    locally; print a key."""
    from gristmill.cli.dev import run_dev

    _logging("WARNING")
    sys.exit(
        run_dev(state_dir.resolve(), port=port, grpc_port=grpc_port, workers=workers, models=models)
    )
