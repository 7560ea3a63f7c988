"""``gristmill doctor``: check a deployment's settings and connections and say in plain
words what is wrong. Exit status 1 when something is broken (and with --strict, when
something is risky); the judgements themselves live in gristmill/diagnosis.py.

Registered in gristmill/cli/main.py.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import typer

from core.config import Settings, load_settings
from gristmill.diagnosis import (
    Finding,
    KafkaFacts,
    ModelRow,
    PostgresFacts,
    SecurityView,
    TopicFacts,
    exit_code,
    fail,
    judge_durability,
    judge_kafka,
    judge_postgres,
    judge_schema,
    judge_settings,
    judge_workers,
    render,
)

# How long one check may wait for a broker or the database (seconds): a healthy
# deployment answers in milliseconds; a wrong address should not hang the command.
CONNECT_TIMEOUT_S = 10


def doctor(
    strict: bool = typer.Option(False, help="also exit 1 on warnings (risky, not broken)"),
) -> None:
    """Check settings, Kafka, PostgreSQL, the schema and live workers; print what is wrong."""
    try:
        settings = load_settings()
    except Exception as exc:  # a settings error is the first thing to report
        typer.echo(render([fail("settings", str(exc))]))
        raise typer.Exit(1) from None
    findings = diagnose(settings)
    typer.echo(render(findings))
    raise typer.Exit(exit_code(findings, strict=strict))


def diagnose(settings: Settings) -> list[Finding]:
    from core.topics import dead_letter_topic, request_topic
    from core.vocab import PRIORITY_CLASSES

    findings = judge_settings(
        SecurityView(
            kafka_bootstrap=settings.kafka_bootstrap,
            kafka_protocol=settings.kafka_security_protocol,
            kafka_mechanism=settings.kafka_sasl_mechanism,
            kafka_verify_hostname=settings.kafka_ssl_verify_hostname,
            forwarded_allow_ips=settings.forwarded_allow_ips,
        )
    )
    pg = postgres_facts(settings)
    findings += judge_postgres(pg)
    capacities: list[Mapping[str, float]] = []
    if not pg.error:
        current, heads, known = schema_revisions(settings)
        findings += judge_schema(current, heads, known)
        if current:
            models, capacities = worker_facts(settings)
            findings += judge_workers(models, capacities)
    topics: dict[str, str] = {str(c): request_topic(settings, c) for c in PRIORITY_CLASSES}
    topics["deadletter"] = dead_letter_topic(settings)
    kafka = kafka_facts(settings, list(topics.values()))
    findings += judge_kafka(
        kafka,
        bootstrap=settings.kafka_bootstrap,
        protocol=settings.kafka_security_protocol,
        username=settings.kafka_sasl_username,
        topics=topics,
        live_schedulers=len(capacities),
    )
    if not kafka.error:
        findings += judge_durability(kafka.topics, pg, allowed=settings.allow_weak_durability)
    return findings


def kafka_facts(settings: Settings, topics: list[str]) -> KafkaFacts:
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    from core.kafka import admin_config

    errors: list[str] = []
    lock = threading.Lock()

    def on_error(err: Any) -> None:  # librdkafka says why (TLS, SASL, transport) only here
        with lock:
            errors.append(str(err.str() if hasattr(err, "str") else err))

    config = admin_config(
        settings,
        error_cb=on_error,
        **{"socket.connection.setup.timeout.ms": CONNECT_TIMEOUT_S * 1000, "log_level": 0},
    )
    admin = AdminClient(config)
    try:
        md = admin.list_topics(timeout=CONNECT_TIMEOUT_S)
    except Exception as exc:
        admin.poll(1.0)  # serve the error callbacks still queued
        with lock:
            why = "; ".join(dict.fromkeys(errors)) or str(exc)
        return KafkaFacts(error=why)
    present = [t for t in topics if t in md.topics and md.topics[t].error is None]
    min_insync: dict[str, int | None] = dict.fromkeys(present)
    unclean: dict[str, bool] = dict.fromkeys(present, False)
    if present:
        resources = [ConfigResource(ResourceType.TOPIC, t) for t in present]
        for res, fut in admin.describe_configs(resources).items():
            try:
                configs = fut.result(timeout=CONNECT_TIMEOUT_S)
                entry = configs.get("min.insync.replicas")
                min_insync[res.name] = int(entry.value) if entry is not None else None
                election = configs.get("unclean.leader.election.enable")
                unclean[res.name] = election is not None and election.value == "true"
            except Exception:  # no DescribeConfigs right: judged without it
                min_insync[res.name] = None
    facts: dict[str, TopicFacts] = {}
    for t in present:
        parts = md.topics[t].partitions.values()
        facts[t] = TopicFacts(
            partitions=len(parts),
            replicas=min((len(p.replicas) for p in parts), default=0),
            min_isr_now=min((len(p.isrs) for p in parts), default=0),
            min_insync_replicas=min_insync[t],
            unclean_election=unclean[t],
        )
    return KafkaFacts(brokers=len(md.brokers), topics=facts)


def postgres_facts(settings: Settings) -> PostgresFacts:
    import psycopg

    from results.db import libpq_url

    url = libpq_url(settings.database_url)
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.Error as exc:
        from sqlalchemy.engine import make_url

        u = make_url(url)
        return PostgresFacts(
            error=str(exc), host=f"{u.host}:{u.port or 5432}", user=u.username or ""
        )
    with conn:
        options = {o.keyword.decode(): o.val for o in conn.pgconn.info}

        def show(name: str) -> str:
            row = conn.execute(f"SHOW {name}").fetchone()  # names below are constants
            return str(row[0]) if row else ""

        ssl_row = conn.execute(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
        ).fetchone()
        replicas_row = conn.execute("SELECT count(*) FROM pg_stat_replication").fetchone()
        recovery_row = conn.execute("SELECT pg_is_in_recovery()").fetchone()

        def opt(key: str) -> str:
            value = options.get(key)
            return value.decode() if value else ""

        return PostgresFacts(
            host=f"{conn.info.host}:{conn.info.port}",
            user=conn.info.user,
            ssl=bool(ssl_row and ssl_row[0]),
            sslmode=opt("sslmode") or "prefer",
            synchronous_commit=show("synchronous_commit"),
            synchronous_standby_names=show("synchronous_standby_names"),
            fsync=show("fsync"),
            replicas=int(replicas_row[0]) if replicas_row else 0,
            in_recovery=bool(recovery_row and recovery_row[0]),
        )


def schema_revisions(settings: Settings) -> tuple[list[str] | None, list[str], list[str]]:
    """(the database's revisions or None without a schema, the code's heads, all it knows)."""
    from alembic.script import ScriptDirectory
    from sqlalchemy import inspect, text

    from gristmill.migrate import alembic_config
    from results.db import make_engine

    script = ScriptDirectory.from_config(alembic_config(settings))
    heads = list(script.get_heads())
    known = [r.revision for r in script.walk_revisions()]
    engine = make_engine(settings.database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table("alembic_version"):
                return None, heads, known
            rows = conn.execute(text("SELECT version_num FROM alembic_version")).all()
    finally:
        engine.dispose()
    return [r[0] for r in rows], heads, known


def worker_facts(settings: Settings) -> tuple[list[ModelRow], list[Mapping[str, float]]]:
    from results.db import make_engine
    from results.load import live_reports_stmt
    from results.modelregistry import live_stmt

    engine = make_engine(settings.database_url, pool_size=1)
    try:
        with engine.connect() as conn:
            models = [ModelRow(r.name, r.version, bool(r.live)) for r in conn.execute(live_stmt())]
            reports = conn.execute(
                live_reports_stmt(settings.load_report_stale_s, settings.topic_prefix)
            ).all()
    finally:
        engine.dispose()
    return models, [dict(r.capacity) for r in reports]


if __name__ == "__main__":  # python -m gristmill.cli.doctor (before it is wired into main)
    typer.run(doctor)
