"""What ``gristmill doctor`` concludes from what it observed. Pure: every judgement takes
the observed facts (gathered by gristmill/cli/doctor.py) and returns findings in plain
words, each saying what is wrong and what to do."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from core.durability import TopicDurability, kafka_problems, postgres_problems


class Level(Enum):
    OK = "ok"
    WARN = "WARN"
    FAIL = "FAIL"


@dataclass(frozen=True)
class Finding:
    level: Level
    area: str
    message: str


def ok(area: str, message: str) -> Finding:
    return Finding(Level.OK, area, message)


def warn(area: str, message: str) -> Finding:
    return Finding(Level.WARN, area, message)


def fail(area: str, message: str) -> Finding:
    return Finding(Level.FAIL, area, message)


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def hosts_of(bootstrap: str) -> list[str]:
    return [hp.rsplit(":", 1)[0] for hp in bootstrap.split(",") if hp.strip()]


# ------------------------------------------------------------------------ settings


@dataclass(frozen=True)
class SecurityView:
    kafka_bootstrap: str
    kafka_protocol: str
    kafka_mechanism: str
    kafka_verify_hostname: bool
    forwarded_allow_ips: str


def judge_settings(s: SecurityView) -> list[Finding]:
    out: list[Finding] = []
    remote = not all(is_loopback(h) for h in hosts_of(s.kafka_bootstrap))
    if s.kafka_protocol == "PLAINTEXT" and remote:
        out.append(
            warn(
                "settings",
                f"Kafka at {s.kafka_bootstrap} is reached without TLS or a login: requests "
                "cross the network in clear. Set GRISTMILL_KAFKA_SECURITY_PROTOCOL=SASL_SSL "
                "(and GRISTMILL_KAFKA_SASL_*, GRISTMILL_KAFKA_SSL_CA_LOCATION).",
            )
        )
    if s.kafka_protocol == "SASL_PLAINTEXT" and s.kafka_mechanism == "PLAIN":
        out.append(
            warn(
                "settings",
                "SASL PLAIN without TLS sends the Kafka password in clear: use SASL_SSL.",
            )
        )
    if s.kafka_protocol in ("SSL", "SASL_SSL") and not s.kafka_verify_hostname:
        out.append(
            warn(
                "settings",
                "GRISTMILL_KAFKA_SSL_VERIFY_HOSTNAME is off: any certificate the CA signed "
                "passes for any broker.",
            )
        )
    if s.forwarded_allow_ips.strip() == "*":
        out.append(
            warn(
                "settings",
                "GRISTMILL_FORWARDED_ALLOW_IPS is *: any client can claim any address with "
                "X-Forwarded-For. List the ingress or load balancer addresses instead.",
            )
        )
    if not out:
        out.append(ok("settings", f"Kafka over {s.kafka_protocol}; settings consistent"))
    return out


# ------------------------------------------------------------------------ kafka


@dataclass(frozen=True)
class TopicFacts:
    partitions: int
    replicas: int  # the fewest replicas any partition has
    min_isr_now: int  # the smallest in-sync replica set right now
    min_insync_replicas: int | None  # the topic's effective min.insync.replicas
    unclean_election: bool = False  # unclean.leader.election.enable


@dataclass(frozen=True)
class KafkaFacts:
    error: str = ""  # why no broker answered (empty: reachable)
    brokers: int = 0
    topics: Mapping[str, TopicFacts] = field(default_factory=dict)


def explain_kafka_error(error: str, bootstrap: str, username: str) -> str:
    e = error.lower()
    if "authentication" in e or "sasl" in e:
        return (
            f"the brokers refused the SASL login of user {username!r}: check "
            "GRISTMILL_KAFKA_SASL_USERNAME, _PASSWORD and _MECHANISM"
        )
    if "ssl" in e or "certificate" in e or "handshake" in e:
        return (
            "the TLS handshake with the brokers failed (a certificate not signed by "
            "GRISTMILL_KAFKA_SSL_CA_LOCATION, a host name the certificate does not name, "
            "or a listener that does not speak TLS)"
        )
    return f"no Kafka broker answers at {bootstrap} (is it running, is the address right?)"


def judge_kafka(
    facts: KafkaFacts,
    *,
    bootstrap: str,
    protocol: str,
    username: str,
    topics: Mapping[str, str],
    live_schedulers: int,
) -> list[Finding]:
    """``topics``: class (or "deadletter") -> topic name that must exist."""
    if facts.error:
        why = explain_kafka_error(facts.error, bootstrap, username)
        return [fail("kafka", f"{why}. Kafka said: {facts.error}")]
    out = [ok("kafka", f"{facts.brokers} broker(s) reachable at {bootstrap} over {protocol}")]
    partitions: dict[str, int] = {}
    for cls, name in topics.items():
        t = facts.topics.get(name)
        if t is None:
            out.append(fail("kafka", f"topic {name} does not exist: run `gristmill migrate`"))
            continue
        partitions[cls] = t.partitions
        out.extend(_judge_topic(name, t, facts.brokers))
    if partitions:
        listing = ", ".join(f"{c} {n}" for c, n in partitions.items())
        out.append(ok("kafka", f"partitions per class: {listing}"))
        for cls, n in partitions.items():
            if cls != "deadletter" and n < live_schedulers:
                out.append(
                    warn(
                        "kafka",
                        f"class {cls} has {n} partitions but {live_schedulers} schedulers "
                        f"run: {live_schedulers - n} of them get none of its traffic. Add "
                        "partitions or cap the schedulers' replicas.",
                    )
                )
    return out


def _judge_topic(name: str, t: TopicFacts, brokers: int) -> list[Finding]:
    """What the durability rules (judge_durability) do not cover: settings that stop
    writes, and the replicas in sync right now."""
    out: list[Finding] = []
    mir = t.min_insync_replicas
    if mir is None:
        return out
    if mir > t.replicas:
        out.append(
            fail(
                "kafka",
                f"topic {name}: min.insync.replicas {mir} > {t.replicas} replicas: no "
                "write can succeed (every request gets 503).",
            )
        )
    elif t.replicas > 1 and mir == t.replicas:
        out.append(
            warn(
                "kafka",
                f"topic {name}: min.insync.replicas equals its {t.replicas} replicas: "
                "one broker down stops every write (503). Use replicas - 1.",
            )
        )
    if t.min_isr_now < mir <= t.replicas:
        out.append(
            fail(
                "kafka",
                f"topic {name}: a partition has {t.min_isr_now} in-sync replicas, fewer "
                f"than min.insync.replicas {mir}: writes to it fail now.",
            )
        )
    return out


def judge_durability(
    topics: Mapping[str, TopicFacts], pg: PostgresFacts | None, *, allowed: bool
) -> list[Finding]:
    """The start-up durability rules (core/durability.py, decision 20) on what was
    observed: broken unless GRISTMILL_ALLOW_WEAK_DURABILITY waives them (then a warning,
    as the processes start anyway)."""
    problems = kafka_problems(
        {
            name: TopicDurability(t.replicas, t.min_insync_replicas or 1, t.unclean_election)
            for name, t in topics.items()
        }
    )
    if pg is not None and not pg.error:
        problems += postgres_problems(
            {"synchronous_commit": pg.synchronous_commit, "fsync": pg.fsync}
        )
    if not problems:
        return [ok("durable", "replication, min.insync.replicas, synchronous_commit, fsync")]
    if allowed:
        return [
            warn("durable", f"{p} (allowed: GRISTMILL_ALLOW_WEAK_DURABILITY is set)")
            for p in problems
        ]
    return [
        fail("durable", f"{p}: the API and schedulers refuse to start until it is fixed")
        for p in problems
    ]


# ------------------------------------------------------------------------ postgresql


@dataclass(frozen=True)
class PostgresFacts:
    error: str = ""
    host: str = ""
    user: str = ""
    ssl: bool = False
    sslmode: str = ""
    synchronous_commit: str = ""
    synchronous_standby_names: str = ""
    fsync: str = "on"
    replicas: int = 0
    in_recovery: bool = False


def explain_postgres_error(error: str, host: str, user: str) -> str:
    e = error.lower()
    if "password authentication failed" in e or ("password" in e and "supplied" in e):
        return f"PostgreSQL refused the password of user {user!r} (check DATABASE_URL)"
    if "no encryption" in e or ("pg_hba.conf" in e and "ssl" not in e):
        return (
            "PostgreSQL takes only TLS connections from here: add sslmode=verify-full "
            "and sslrootcert to DATABASE_URL (or set PGSSLMODE, PGSSLROOTCERT)"
        )
    if "certificate" in e or "ssl" in e:
        return (
            "the TLS handshake with PostgreSQL failed (a server certificate not signed by "
            "sslrootcert, or one that does not name the host)"
        )
    return f"cannot connect to PostgreSQL at {host}"


def judge_postgres(f: PostgresFacts) -> list[Finding]:
    if f.error:
        why = explain_postgres_error(f.error, f.host, f.user)
        return [fail("postgres", f"{why}. PostgreSQL said: {f.error.strip()}")]
    tls = "with TLS" if f.ssl else "without TLS"
    out = [ok("postgres", f"reachable at {f.host} as {f.user}, {tls} (sslmode {f.sslmode})")]
    if f.in_recovery:
        out.append(
            fail(
                "postgres",
                "connected to a read-only standby: point DATABASE_URL at the primary "
                "(CloudNativePG: the <cluster>-rw service).",
            )
        )
    if not f.ssl and not is_loopback(f.host.rsplit(":", 1)[0]):
        out.append(
            warn(
                "postgres",
                "the connection is not encrypted: set sslmode=verify-full and sslrootcert.",
            )
        )
    elif f.ssl and f.sslmode != "verify-full":
        out.append(
            warn(
                "postgres",
                f"TLS without checking the server (sslmode {f.sslmode}): use verify-full "
                "with sslrootcert, or a man in the middle can read every result.",
            )
        )
    if f.replicas > 0 and not f.synchronous_standby_names:
        out.append(
            warn(
                "postgres",
                f"{f.replicas} standby(s) replicate asynchronously: a failover can lose the "
                "last committed results. Use synchronous replication "
                "(CloudNativePG: spec.postgresql.synchronous).",
            )
        )
    return out


def judge_schema(
    current: Sequence[str] | None, heads: Sequence[str], known: Iterable[str]
) -> list[Finding]:
    if not current:
        return [fail("schema", "the database has no Gristmill schema: run `gristmill migrate`")]
    if sorted(current) == sorted(heads):
        return [ok("schema", f"at revision {', '.join(current)} (head)")]
    unknown = [r for r in current if r not in set(known)]
    if unknown:
        return [
            fail(
                "schema",
                f"the database is at revision {', '.join(unknown)}, which this code does not "
                "know: a newer release migrated it. Run that release (or newer).",
            )
        ]
    return [
        fail(
            "schema",
            f"the database is at revision {', '.join(current)}, this code needs "
            f"{', '.join(heads)}: run `gristmill migrate`.",
        )
    ]


# ------------------------------------------------------------------------ workers


@dataclass(frozen=True)
class ModelRow:
    name: str
    version: str
    live: bool


def judge_workers(
    models: Sequence[ModelRow], capacities: Sequence[Mapping[str, float]]
) -> list[Finding]:
    """``capacities``: one per live scheduler of this deployment, "name@version" ->
    items/s its live workers can compute."""
    if not capacities:
        return [
            fail(
                "workers",
                "no scheduler of this deployment reported in the last seconds: accepted "
                "requests wait in Kafka. Start `gristmill scheduler`.",
            )
        ]
    out: list[Finding] = []
    served: dict[str, tuple[int, float]] = {}
    for cap in capacities:
        for ref, reported in cap.items():
            # A capacity record ({"items_s": ...}, decision 24) or a bare rate.
            items_per_s = reported["items_s"] if isinstance(reported, dict) else reported
            n, total = served.get(ref, (0, 0.0))
            served[ref] = (n + 1, total + items_per_s)
    for ref, (n, total) in sorted(served.items()):
        out.append(
            ok("workers", f"{ref}: live workers under {n} scheduler(s), {total:,.0f} items/s")
        )
    for m in models:
        ref = f"{m.name}@{m.version}"
        if ref not in served and m.live:
            continue  # announced by a scheduler of another deployment sharing the database
        if ref not in served:
            out.append(
                warn(
                    "workers",
                    f"{ref} has no live worker: requests for it get 503 until one starts.",
                )
            )
    if not served:
        out.append(
            fail(
                "workers",
                f"{len(capacities)} scheduler(s) run but none has a live worker: every "
                "request gets 503.",
            )
        )
    return out


def exit_code(findings: Iterable[Finding], *, strict: bool = False) -> int:
    levels = {f.level for f in findings}
    return 1 if Level.FAIL in levels or (strict and Level.WARN in levels) else 0


def render(findings: Sequence[Finding]) -> str:
    lines = [f"  {f.level.value:<4}  {f.area:<9} {f.message}" for f in findings]
    fails = sum(f.level is Level.FAIL for f in findings)
    warns = sum(f.level is Level.WARN for f in findings)
    verdict = "all good" if not fails and not warns else f"{fails} problem(s), {warns} warning(s)"
    return "\n".join([*lines, verdict])
