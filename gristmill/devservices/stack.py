"""A whole Gristmill on loopback (tests, benchmarks, chaos runs): real Kafka, real PostgreSQL,
the API over real HTTP, a scheduler with worker processes.

KAFKA_BOOTSTRAP / DATABASE_URL, when set, point the suite at existing servers;
each run then uses its own topic prefix and consumer group so runs never mix.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from core.config import Settings, settings_from_env
from core.metrics import multiprocess_env
from core.topics import ensure_topics
from gristmill.devservices import KafkaCluster, PostgresServer, free_port
from gristmill.devservices.lifeline import Group, lifeline
from gristmill.migrate import migrate_database
from results.db import make_engine
from results.tenants import create_tenant, issue_key, set_plan

REPO = Path(__file__).resolve().parents[2]  # repo root: processes run from here
# A system on loopback sends webhooks to receivers on loopback (decision 27).
LOOPBACK_WEBHOOKS = '["127.0.0.0/8", "::1/128"]'


def api_command(port: int, processes: int = 1, forwarded_allow_ips: str = "") -> list[str]:
    """An API instance on loopback (shared by the tests, benchmarks and `gristmill dev`);
    ``processes`` > 1 runs that many uvicorn processes on the one port. X-Forwarded-*
    headers are believed only from ``forwarded_allow_ips`` (none by default)."""
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "ingest.main:app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--forwarded-allow-ips",
        forwarded_allow_ips,
        *(["--workers", str(processes)] if processes > 1 else []),
    ]


def cli_api_command(port: int, processes: int = 1) -> list[str]:
    """An API instance on loopback started as a deployment starts it (``gristmill api``):
    its settings, GRISTMILL_FORWARDED_ALLOW_IPS among them, come from the environment."""
    return [
        sys.executable,
        "-m",
        "gristmill",
        "api",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(processes),
    ]


def scheduler_command(workers: int, models: str, socket_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gristmill",
        "scheduler",
        "--workers",
        str(workers),
        "--models",
        models,
        "--socket-dir",
        str(socket_dir),
    ]


def ledger_command() -> list[str]:
    """The durability ledger (decision 54), as a deployment starts it."""
    return [sys.executable, "-m", "gristmill", "ledger", "run"]


@dataclass
class Services:
    bootstrap: str
    database_url: str
    kafka: KafkaCluster | None = None
    postgres: PostgresServer | None = None


@contextmanager
def local_services(
    workdir: Path,
    *,
    n_brokers: int = 1,
    kafka_config: Mapping[str, object] | None = None,
    external: bool = True,
    durable: bool = False,
) -> Iterator[Services]:
    """``kafka_config`` adds broker settings (e.g. a shorter broker session for chaos runs).
    ``external``: use ``KAFKA_BOOTSTRAP`` / ``DATABASE_URL`` when they are set; False:
    always start local servers. ``durable``: PostgreSQL flushes its commits to disk, as
    ``gristmill dev``'s does (tests skip that for speed; benchmarks of slow commits need it)."""
    kafka = pg = None
    env = os.environ if external else {}
    try:
        bootstrap = env.get("KAFKA_BOOTSTRAP")
        if not bootstrap:
            kafka = KafkaCluster(
                workdir / "kafka", n_brokers=n_brokers, partitions=3, extra_config=kafka_config
            )
            kafka.start()
            bootstrap = kafka.bootstrap
        url = env.get("DATABASE_URL")
        if not url:
            # PostgreSQL runs as an unprivileged user, which cannot enter pytest's
            # private (0700) temp folders: give it a traversable one of its own.
            pg_dir = Path(tempfile.mkdtemp(prefix="gristmill-pg-"))
            pg_dir.chmod(0o711)
            pg = PostgresServer(pg_dir, fast=not durable)
            pg.start()
            url = pg.url
        yield Services(bootstrap, url, kafka, pg)
    finally:
        if kafka is not None:
            kafka.stop()
        if pg is not None:
            pg.stop()
            shutil.rmtree(pg.workdir, ignore_errors=True)


@dataclass
class System:
    services: Services
    env: dict[str, str]
    workdir: Path
    url: str = ""
    keys: dict[str, str] = field(default_factory=dict)  # tier -> API key
    tenant_ids: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    held: dict[str, Group | None] = field(default_factory=dict)  # by the lifeline
    tmp_dirs: list[Path] = field(default_factory=list)  # short socket dirs, removed on close

    @property
    def settings(self) -> Settings:
        return settings_from_env(self.env)

    def headers(self, tier: str = "paid") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tier]}"}

    def start_api(
        self,
        name: str = "api",
        env: dict[str, str] | None = None,
        port: int | None = None,
        processes: int = 1,
        cli: bool = False,
        cwd: Path | None = None,
        prefix: Sequence[str] = (),
    ) -> str:
        """Start an API process (``processes`` uvicorn processes on one port); ``port``
        restarts one where clients expect it; ``cli``: by ``gristmill api``; ``cwd``: run
        the code of another checkout (a benchmark's baseline); ``prefix`` runs the command
        (e.g. in a network namespace: gristmill/chaos/netns.py)."""
        port = port or free_port()
        log = (self.workdir / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            [*prefix, *(cli_api_command(port, processes) if cli else api_command(port, processes))],
            env={**self.env, **multiprocess_env(self.workdir / f"{name}.metrics"), **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd or REPO,
            start_new_session=True,
        )
        self._hold(name, f"API {name} (port {port})")
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"API exited; see {self.workdir / (name + '.log')}")
            time.sleep(0.2)
        raise RuntimeError("API did not start")

    def start_scheduler(
        self,
        name: str = "scheduler",
        *,
        workers: int = 2,
        models: str = "sim,all-minilm-l6-v2",
        env: dict[str, str] | None = None,
        prefix: Sequence[str] = (),
    ) -> None:
        run_dir = self.workdir / f"run-{name}"
        if len(str(run_dir / "workers.sock")) > 100:  # AF_UNIX socket paths are short
            run_dir = Path(tempfile.mkdtemp(prefix=f"gm-{name}-"))
            self.tmp_dirs.append(run_dir)
        log = (self.workdir / f"{name}.log").open("ab")
        self.procs[name] = subprocess.Popen(
            [*prefix, *scheduler_command(workers, models, run_dir)],
            env={**self.env, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
        )
        self._hold(name, f"scheduler {name} and its workers")

    def _hold(self, name: str, label: str) -> None:
        lifeline().release(self.held.pop(name, None))  # a restart: the old one is gone
        self.held[name] = lifeline().hold_group(self.procs[name].pid, label)

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout_s: float = 30) -> int | None:
        return self.stop_many([name], sig, timeout_s)[name]

    def stop_many(
        self, names: list[str], sig: int = signal.SIGTERM, timeout_s: float = 30
    ) -> dict[str, int | None]:
        """Signal each process group at once, SIGKILL the groups still there after
        ``timeout_s``; returns the exit codes."""
        procs = {name: self.procs.pop(name) for name in names}
        for p in procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, sig)
        deadline = time.monotonic() + timeout_s
        for name, p in procs.items():
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            # The leader is gone; take what it left in its group (workers) along.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            lifeline().release(self.held.pop(name, None))
        return {name: p.returncode for name, p in procs.items()}

    def wait_until_serving(self, model: str = "sim", timeout_s: float = 120) -> None:
        deadline = time.time() + timeout_s
        last = ""
        while time.time() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode}")
            try:
                r = httpx.post(
                    f"{self.url}/v1/infer",
                    headers=self.headers(),
                    json={"model": model, "input": "warm up"},
                    timeout=30,
                )
            except httpx.TransportError as e:  # the API is still starting
                last = repr(e)
                time.sleep(0.5)
                continue
            if r.status_code == 200:
                return
            last = r.text
            time.sleep(0.5)
        raise RuntimeError(f"model {model} not served in time: {last}")

    def close(self) -> None:
        self.stop_many(list(self.procs))
        for d in self.tmp_dirs:
            shutil.rmtree(d, ignore_errors=True)


def build_system(
    services: Services,
    workdir: Path,
    *,
    sim_batch_ms: int = 100,
    extra_env: Mapping[str, str] | None = None,
) -> System:
    """Topics, schema and tenants for one run; ``extra_env`` goes to every process."""
    run = uuid.uuid4().hex[:8]
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": services.bootstrap,
        "DATABASE_URL": services.database_url,
        "GRISTMILL_TOPIC_PREFIX": f"gm-test-{run}",
        "GRISTMILL_CONSUMER_GROUP": f"gm-test-{run}",
        "GRISTMILL_TOPIC_PARTITIONS": "3",
        "GRISTMILL_SIM_BATCH_MS": str(sim_batch_ms),
        "PYTHONUNBUFFERED": "1",
        # One broker and a throwaway database: below the durability a deployment needs.
        "GRISTMILL_ALLOW_WEAK_DURABILITY": "true",
        "GRISTMILL_WEBHOOK_ALLOW_NETWORKS": LOOPBACK_WEBHOOKS,
        **(extra_env or {}),
    }
    system = System(services=services, env=env, workdir=workdir)
    settings = system.settings
    migrate_database(settings)
    ensure_topics(settings)
    with make_engine(settings.database_url).begin() as conn:
        for tier in ("free", "paid", "enterprise"):
            tenant = create_tenant(conn, f"{tier}-{run}", tier)
            # Rate limits out of the way: load tests and benchmarks measure the pipeline;
            # tests of the limits make tenants of their own.
            set_plan(conn, tenant.name, rate_rps=1e6, burst=1e6, job_items_per_s=1e9)
            system.tenant_ids[tier] = tenant.id
            system.keys[tier] = issue_key(conn, tenant)[1]
    return system
