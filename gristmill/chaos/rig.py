"""The system under test: its own Kafka cluster and PostgreSQL, API instances on fixed
ports (a restarted API comes back where clients expect it) and schedulers in one
consumer group, each with its worker processes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg

from core.topics import request_topic
from core.vocab import TIERS
from gristmill.chaos.netns import Netns
from gristmill.devservices import free_port
from gristmill.devservices.procs import alive, children
from gristmill.devservices.stack import Services, System, build_system, local_services
from results.db import libpq_url

# A killed broker must be fenced, and its partitions (the consumer group's coordinator
# among them) led elsewhere, well within the schedulers' 6 s consumer session, or
# both members time out and drop their partitions. The defaults (9 s fencing, 2 s
# Raft fetch timeout) are too slow for that; see docs/decisions/0006-*.md.
BROKER_CONFIG: dict[str, object] = {
    "broker.session.timeout.ms": 2500,
    "broker.heartbeat.interval.ms": 500,
    "controller.quorum.fetch.timeout.ms": 1500,
    "controller.quorum.election.timeout.ms": 750,
}
LOADED_TIERS = TIERS


@dataclass
class Rig:
    services: Services
    system: System
    n_workers: int
    api_ports: dict[str, int] = field(default_factory=dict)
    schedulers: list[str] = field(default_factory=list)
    log_marks: dict[str, int] = field(default_factory=dict)  # log size at (re)start
    # processes that run in a network namespace of their own (partition faults)
    nets: dict[str, Netns] = field(default_factory=dict)

    # ---- processes -----------------------------------------------------------------
    @property
    def apis(self) -> list[str]:
        return sorted(self.api_ports)

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{self.api_ports[n]}" for n in self.apis]

    def pid(self, name: str) -> int:
        return self.system.procs[name].pid

    def _log(self, name: str) -> Path:
        return self.system.workdir / f"{name}.log"

    def _mark(self, name: str) -> None:
        path = self._log(name)
        self.log_marks[name] = path.stat().st_size if path.exists() else 0

    def _prefix(self, name: str) -> list[str]:
        net = self.nets.get(name)
        return net.prefix if net is not None else []

    def start_scheduler(self, name: str) -> None:
        self._mark(name)
        self.system.start_scheduler(
            name, workers=self.n_workers, models="sim", prefix=self._prefix(name)
        )
        if name not in self.schedulers:
            self.schedulers.append(name)

    def start_api(self, name: str) -> None:
        port = self.api_ports.setdefault(name, free_port())
        self.system.start_api(name, port=port, prefix=self._prefix(name))

    def isolate(self, name: str, *, api_port: int | None = None) -> None:
        """Run ``name`` (not yet started) in a network namespace of its own, reaching
        Kafka and PostgreSQL through veth pairs a fault can cut."""
        kafka, pg = self.services.kafka, self.services.postgres
        assert kafka is not None and pg is not None
        ports = [int(kafka.node_bootstrap(i).rsplit(":", 1)[1]) for i in range(kafka.n_brokers)]
        net = Netns(len(self.nets) + 1, ports, pg.port, [api_port] if api_port else [])
        net.create(self.system.workdir)
        self.nets[name] = net

    def close_nets(self) -> None:
        for net in self.nets.values():
            net.destroy()

    def forget(self, name: str) -> None:
        """The process was killed from outside: reap it and drop it from the system."""
        p = self.system.procs.pop(name, None)
        if p is not None:
            p.wait(30)

    def workers(self, scheduler: str) -> list[int]:
        return children(self.pid(scheduler))

    # ---- readiness -----------------------------------------------------------------
    def scheduler_ready(self, name: str) -> bool:
        """Running, in the group, and every worker it spawned has said hello."""
        p = self.system.procs.get(name)
        if p is None or p.poll() is not None:
            return False
        try:
            with self._log(name).open("rb") as f:
                f.seek(self.log_marks.get(name, 0))
                text = f.read().decode(errors="replace")
        except OSError:
            return False
        spawned, ready = text.count("spawned worker"), text.count(" ready: ")
        return (
            "scheduler running" in text
            and spawned >= self.n_workers
            and ready >= spawned
            and len([w for w in self.workers(name) if alive(w)]) >= self.n_workers
        )

    def api_ready(self, name: str) -> bool:
        p = self.system.procs.get(name)
        if p is None or p.poll() is not None:
            return False
        try:
            url = f"http://127.0.0.1:{self.api_ports[name]}/readyz"
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def not_ready(self) -> list[str]:
        """Names of the components that are not (yet) serving."""
        out = [n for n in self.schedulers if not self.scheduler_ready(n)]
        out += [n for n in self.apis if not self.api_ready(n)]
        kafka, pg = self.services.kafka, self.services.postgres
        if kafka is not None:
            out += [f"broker-{i}" for i in range(kafka.n_brokers) if not kafka.is_running(i)]
        if pg is not None and not pg.running:
            out.append("postgres")
        return out

    def wait_ready(self, timeout_s: float) -> list[str]:
        """Wait until everything serves; returns what does not (at once if a process died)."""
        deadline = time.monotonic() + timeout_s
        while missing := self.not_ready():
            dead = [n for n, p in self.system.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                return missing
            time.sleep(0.25)
        return []

    def loaded_partitions(self) -> set[tuple[str, int]]:
        s = self.system.settings
        return {
            (request_topic(s, tier), p) for tier in LOADED_TIERS for p in range(s.topic_partitions)
        }

    def has_jobs_api(self) -> bool:
        try:
            spec = httpx.get(f"{self.urls[0]}/openapi.json", timeout=5).json()
        except (httpx.HTTPError, ValueError):
            return False
        return "post" in spec.get("paths", {}).get("/v1/jobs", {})


def durable_commits(database_url: str) -> None:
    """The throwaway server runs with synchronous_commit=off for speed; a crash would
    then lose acknowledged commits. Chaos runs crash it, so make commits durable."""
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET synchronous_commit = on")
        conn.execute("SELECT pg_reload_conf()")


@contextmanager
def own_services(workdir: Path, *, n_brokers: int) -> Iterator[Services]:
    """Always local servers (never KAFKA_BOOTSTRAP / DATABASE_URL): faults kill them."""
    cm = local_services(workdir, n_brokers=n_brokers, kafka_config=BROKER_CONFIG, external=False)
    services = cm.__enter__()
    try:
        durable_commits(services.database_url)
        yield services
    finally:
        cm.__exit__(None, None, None)


@contextmanager
def running_rig(
    services: Services,
    workdir: Path,
    *,
    schedulers: int = 2,
    apis: int = 2,
    workers: int = 2,
    extra_env: Mapping[str, str] | None = None,
    ready_timeout_s: float = 120,
    partitions: bool = False,
) -> Iterator[Rig]:
    """``partitions``: the last scheduler and the last API run in network namespaces of
    their own (gristmill/chaos/netns.py), for the ``cut-*`` faults."""
    replication = services.kafka.n_brokers if services.kafka is not None else 1
    env = {"GRISTMILL_TOPIC_REPLICATION": str(min(3, replication)), **(extra_env or {})}
    workdir.mkdir(parents=True, exist_ok=True)
    system = build_system(services, workdir, extra_env=env)
    rig = Rig(services=services, system=system, n_workers=workers)
    try:
        sched_names = [f"sched-{chr(ord('a') + i)}" for i in range(schedulers)]
        api_names = [f"api-{chr(ord('a') + i)}" for i in range(apis)]
        if partitions:
            rig.isolate(sched_names[-1])
            port = rig.api_ports.setdefault(api_names[-1], free_port())
            rig.isolate(api_names[-1], api_port=port)
        for name in sched_names:
            rig.start_scheduler(name)
        for name in api_names:
            rig.start_api(name)
        system.url = rig.urls[0]
        missing = rig.wait_ready(ready_timeout_s)
        if missing:
            raise RuntimeError(f"not ready in time: {missing}; logs in {workdir}")
        system.wait_until_serving("sim")
        yield rig
    finally:
        system.close()
        rig.close_nets()
