"""``gristmill dev``: the whole system on one machine, from nothing, in one command.

Starts a throwaway Kafka (KRaft, from Maven jars) and PostgreSQL (initdb) under
the state directory, unless KAFKA_BOOTSTRAP / DATABASE_URL point at real ones;
migrates; creates a ``dev`` tenant with a fresh key; starts the API and a
scheduler with its workers; checks one request end to end; starts the durability
ledger (decision 54); prints how to call it and writes ``.gristmill/dev.env``.

Supervising (decision 46): an API, scheduler or ledger process that dies is started again
(and it says so) while the rest keep serving, as an orchestrator would; a scheduler's
workers are restarted by the scheduler itself.

Stopping (decision 28): Ctrl-C or SIGTERM stops everything in order, within
``APPS_GRACE_S`` + ``SERVICES_GRACE_S`` at most; another Ctrl-C at least half a
second later stops everything at once. If this process dies without stopping
(SIGKILL, the OOM killer), the lifeline's watchdog stops what it started within
seconds, and the next start stops whatever is still left of it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from core.config import settings_from_env
from core.metrics import multiprocess_env
from core.models.registry import LM_NAME
from core.redact import write_private
from gristmill.devservices import KafkaCluster, PostgresServer, free_port
from gristmill.devservices.kafka import STOP_GRACE_S as KAFKA_STOP_GRACE_S
from gristmill.devservices.leftovers import (
    RECORD_FILE,
    StateDirError,
    lock_state_dir,
    stop_leftovers,
)
from gristmill.devservices.lifeline import Group, lifeline, stop
from gristmill.devservices.ports import port_free, port_holder
from gristmill.devservices.stack import (
    LOOPBACK_WEBHOOKS,
    api_command,
    ledger_command,
    scheduler_command,
)
from gristmill.devservices.stopsignals import StopSignals
from gristmill.restarts import RestartPolicy
from scheduler.runtime.service import SHUTDOWN_DRAIN_S

# SIGTERM to SIGKILL for the API and the scheduler: the scheduler drains what it has
# consumed (SHUTDOWN_DRAIN_S, 10 s), then finishes the batches on its workers, persists
# them and commits its offsets; 10 s more covers that for batches of a few seconds (a
# loaded dev system with the sim model stops API and scheduler in 5.0 s on the shared
# 2-core box, decision 28). Killed later than that, its unfinished requests are read
# again by the partitions' next owner (at-least-once): nothing accepted is lost.
APPS_GRACE_S = SHUTDOWN_DRAIN_S + 10.0
# Kafka gets its own controlled-shutdown bound; PostgreSQL's fast shutdown the same.
SERVICES_GRACE_S = KAFKA_STOP_GRACE_S
READY_TIMEOUT_S = 300.0


class _Stopped(Exception):
    """A stop signal came while starting: raised by us between steps, never by the
    signal handler (an exception thrown into a Popen or a cleanup loses processes)."""


def _say(text: str) -> None:
    print(text, flush=True)


def _port_message(port: int, holder: str) -> str:
    return (
        f"port {port} is already in use by {holder}.\n"
        f"Stop that process, or start on another port: gristmill dev --port {port + 1} "
        f"(or --port 0 to pick a free one; it is printed and written to dev.env). "
        f"With make: make dev DEV_ARGS='--port 0'."
    )


class _Apps:
    """The API, the scheduler and the ledger: each leads its own session, held by the
    lifeline, and is started again when it dies (``supervise``)."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.held: dict[str, Group | None] = {}
        self.log_marks: dict[str, int] = {}  # where this run's part of each log begins
        # How each one starts: its command, lifeline label and extra environment (made
        # at each start: the API's metrics directory is emptied as `gristmill api` does).
        self.how: dict[str, tuple[list[str], str, Callable[[], dict[str, str]]]] = {}
        self.policy = RestartPolicy()
        self.due: dict[str, float] = {}  # died: restart at this monotonic time

    def start(
        self,
        name: str,
        cmd: list[str],
        label: str,
        extra_env: Callable[[], dict[str, str]] = dict,
    ) -> None:
        self.how[name] = (cmd, label, extra_env)
        with (self.logs / f"{name}.log").open("ab") as log:
            self.log_marks.setdefault(name, log.tell())
            proc = subprocess.Popen(
                cmd,
                env={**self.env, **extra_env()},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[name] = proc
        self.held[name] = lifeline().hold_group(proc.pid, label)
        self.policy.started(name, time.monotonic())

    def log_since_start(self, name: str) -> str:
        try:
            with (self.logs / f"{name}.log").open("rb") as f:
                f.seek(self.log_marks.get(name, 0))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def exited(self) -> str | None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                return f"the {name} exited with {p.returncode}; see {self.logs / (name + '.log')}"
        return None

    def supervise(self, now: float) -> None:
        """Restart what died: at once, or after a growing pause while it keeps dying
        within a minute of its start (gristmill/restarts.py)."""
        for name, p in self.procs.items():
            if name in self.due or p.poll() is None:
                continue
            at = self.policy.died(name, now)
            self.due[name] = at
            # What is left of its group (a scheduler's workers, uvicorn's processes) goes
            # with it: the new one starts clean, on the same port and socket.
            group = self.held.pop(name, None)
            if group is not None:
                stop([group], grace_s=0)
                lifeline().release(group)
            when = "now" if at <= now else f"in {at - now:.0f} s"
            _say(
                f"the {name} exited with {p.returncode}; restarting it {when} "
                f"(restart {self.policy.restarts(name)}; see {self.logs / (name + '.log')})"
            )
        for name, at in list(self.due.items()):
            if now >= at:
                del self.due[name]
                cmd, label, extra_env = self.how[name]
                self.start(name, cmd, label, extra_env)
                _say(f"the {name} is running again (pid {self.procs[name].pid})")

    def stop(self, now: threading.Event) -> None:
        self.due.clear()
        targets = [g for g in self.held.values() if g is not None]
        started = time.monotonic()
        # SIGTERM to each group (uvicorn's processes stop, the scheduler drains, its
        # workers ignore it and wait for their scheduler), SIGKILL after the grace.
        _, survivors = stop(
            targets,
            grace_s=APPS_GRACE_S,
            give_up=now.is_set,
            on_kill=lambda left: _say(f"SIGKILL, still running after the grace: {'; '.join(left)}"),
        )
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(1)
        if targets:
            what = "API, scheduler and ledger" if "ledger" in self.procs else "API and scheduler"
            _say(f"{what} stopped in {time.monotonic() - started:.1f} s")
        if survivors:
            _say(f"still running after SIGKILL: {'; '.join(survivors)}")
        for g in targets:
            lifeline().release(g)
        self.held.clear()


def _probe(url: str, key: str, model: str) -> httpx.Response:
    """One real request for ``model``: a completion for the generation model, an
    inference for the others."""
    headers = {"Authorization": f"Bearer {key}"}
    if model.split("@")[0] == LM_NAME:
        body = {"model": model, "prompt": "hello gristmill", "max_tokens": 2, "temperature": 0}
        return httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=15)
    body = {"model": model, "input": "hello gristmill"}
    return httpx.post(f"{url}/v1/infer", json=body, headers=headers, timeout=15)


def _wait_ready(
    url: str,
    key: str,
    models: list[str],
    timeout_s: float,
    exited: Callable[[], str | None],
    stopping: threading.Event,
) -> dict[str, dict[str, object]]:
    """Poll until one real request for each model succeeds end to end: nothing is
    listed as served before it answers. Returns each model's first answer."""
    deadline = time.monotonic() + timeout_s
    answers: dict[str, dict[str, object]] = {}
    last = "no answer yet"
    while time.monotonic() < deadline:
        if stopping.is_set():
            raise _Stopped
        if (why := exited()) is not None:
            raise RuntimeError(why)
        for model in [m for m in models if m not in answers]:
            try:
                r = _probe(url, key, model)
                if r.status_code == 200:
                    answers[model] = r.json()
                    continue
                last = f"{model}: {r.status_code} {r.text[:200]}"
            except httpx.HTTPError as exc:
                last = f"{model}: {exc!r}"
        if len(answers) == len(models):
            return answers
        stopping.wait(1.0)
    raise RuntimeError(f"system did not become ready in {timeout_s:.0f}s: {last}")


def _stop_services(
    kafka: KafkaCluster | None, pg: PostgresServer | None, now: threading.Event
) -> None:
    """Kafka and PostgreSQL stop together (each is bounded by SERVICES_GRACE_S); a second
    Ctrl-C meanwhile kills both at once."""
    errors: list[str] = []

    def run(what: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:
            errors.append(f"{what}: {exc}")

    def stop_pg() -> None:
        if pg is not None:
            pg.stop(timeout_s=SERVICES_GRACE_S)

    threads = []
    if kafka is not None:
        threads.append(threading.Thread(target=run, args=("Kafka", kafka.stop), daemon=True))
    if pg is not None:
        threads.append(threading.Thread(target=run, args=("PostgreSQL", stop_pg), daemon=True))
    for t in threads:
        t.start()
    deadline = time.monotonic() + SERVICES_GRACE_S + 5
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        if now.wait(0.1):
            lifeline().stop_all(grace_s=0)  # SIGKILL: the orderly stops then return
            break
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    for e in errors:
        _say(f"stopping {e}")


def run_dev(state_dir: Path, *, port: int, workers: int, models: str, grpc_port: int = -1) -> int:
    from core.topics import ensure_topics
    from gristmill.migrate import migrate_database
    from results.db import make_engine
    from results.tenants import Tenant, create_tenant, get_tenant, issue_key

    # Installed before anything starts: no signal may find us half set up. A second
    # Ctrl-C kills everything from the handler itself, whatever the main thread waits on.
    stop_signals = StopSignals(on_now=lifeline().kill_now)
    stop_signals.install()

    def checkpoint() -> None:
        if stop_signals.orderly.is_set():
            raise _Stopped

    services = state_dir / "services"
    logs = state_dir / "logs"
    env = dict(os.environ)
    # A local broker and a throwaway database: allowed below production durability.
    env.setdefault("GRISTMILL_ALLOW_WEAK_DURABILITY", "true")
    env.setdefault("GRISTMILL_WEBHOOK_ALLOW_NETWORKS", LOOPBACK_WEBHOOKS)
    kafka: KafkaCluster | None = None
    pg: PostgresServer | None = None
    apps = _Apps(env, logs)
    lock: int | None = None
    try:
        lock = lock_state_dir(state_dir)
        stop_leftovers(state_dir, services, _say)
        if port == 0:
            port = free_port()
        elif not port_free(port):  # checked before the minutes it takes to start the rest
            raise StateDirError(_port_message(port, port_holder(port)))
        if grpc_port == 0:
            grpc_port = free_port()
        elif grpc_port > 0 and not port_free(grpc_port):
            raise StateDirError(_port_message(grpc_port, port_holder(grpc_port)))
        lifeline().record_to(state_dir / RECORD_FILE)
        # A throwaway system: each run starts from clean data (see docs/architecture.md);
        # nothing of an earlier run still runs on it (stop_leftovers).
        shutil.rmtree(services, ignore_errors=True)
        logs.mkdir(parents=True, exist_ok=True)
        if "KAFKA_BOOTSTRAP" not in env:
            _say("starting Kafka (KRaft) ...")
            kafka = KafkaCluster(services / "kafka", n_brokers=1, partitions=6)
            kafka.start()
            env["KAFKA_BOOTSTRAP"] = kafka.bootstrap
        checkpoint()
        if "DATABASE_URL" not in env:
            _say("starting PostgreSQL ...")
            pg = PostgresServer(services / "postgres")
            pg.start()
            env["DATABASE_URL"] = pg.url
        checkpoint()
        settings = settings_from_env(env)
        migrate_database(settings)
        ensure_topics(settings)
        checkpoint()
        with make_engine(settings.database_url).begin() as conn:
            try:
                tenant: Tenant = get_tenant(conn, "dev")
            except Exception:
                tenant = create_tenant(conn, "dev", "enterprise")
            _, key = issue_key(conn, tenant)

        url = f"http://127.0.0.1:{port}"
        _say(f"starting API on {url} and a scheduler with {workers} worker(s) [{models}] ...")
        # Every API process writes its metrics to one directory that /metrics sums, as
        # under `gristmill api` (emptied at each start of the API).
        apps.start(
            "api",
            api_command(port, settings.api_processes),
            f"API (port {port})",
            lambda: {
                **multiprocess_env(state_dir / "metrics" / "api"),
                "GRISTMILL_GRPC_PORT": str(max(grpc_port, 0)),
            },
        )
        apps.start(
            "scheduler",
            scheduler_command(workers, models, state_dir / "run"),
            "scheduler and its workers",
        )
        served = [m for m in models.split(",") if m]
        try:
            answers = _wait_ready(
                url, key, served, READY_TIMEOUT_S, apps.exited, stop_signals.orderly
            )
        except RuntimeError:
            # uvicorn exits with 3 when it cannot bind: taken since we checked it.
            if re.search("address already in use", apps.log_since_start("api"), re.I):
                raise StateDirError(_port_message(port, port_holder(port))) from None
            raise

        # `export` lines: `source .gristmill/dev.env` gives the CLI and SDKs started from
        # that shell their URL and key too.
        write_private(
            state_dir / "dev.env",
            f"export GRISTMILL_URL={url}\nexport GRISTMILL_API_KEY={key}\n"
            + (f"export GRISTMILL_GRPC_ADDRESS=127.0.0.1:{grpc_port}\n" if grpc_port > 0 else "")
            + f"export KAFKA_BOOTSTRAP={env['KAFKA_BOOTSTRAP']}\n"
            f"export DATABASE_URL={env['DATABASE_URL']}\n",
        )
        # The ledger once the system answers: it is not on a request's path, so it
        # neither delays nor fails the start-up (a ledger that dies is restarted).
        ledger_port = _ledger_metrics_port(env, settings.ledger_metrics_port)
        apps.start(
            "ledger",
            ledger_command(),
            "durability ledger",
            lambda: {"GRISTMILL_LEDGER_METRICS_PORT": str(ledger_port)},
        )
        answer = answers[served[0]]
        _say(
            f"""
Gristmill is running.
  API:       {url}   (docs at {url}/docs)
  gRPC:      {_grpc_note(grpc_port)}
  API key:   {key}
  Kafka:     {env["KAFKA_BOOTSTRAP"]}
  Postgres:  {env["DATABASE_URL"]}
  Ledger:    {_ledger_note(ledger_port)}
  Logs:      {logs}
  Env file:  {state_dir / "dev.env"}

Try it:
  curl -s {url}/v1/infer -H 'Authorization: Bearer {key}' \\
       -H 'Content-Type: application/json' -d '{{"model": "sim", "input": "hello"}}'

Models served (each answered): {", ".join(served)}
First answer: {answer.get("output")}  (batch of {answer.get("batch_size")})
{_unserved_note(url, served)}An API, scheduler or ledger process that dies is restarted.
Press Ctrl-C to stop."""
        )
        while not stop_signals.orderly.wait(1.0):
            apps.supervise(time.monotonic())
        return 0
    except _Stopped:
        return 0
    except StateDirError as exc:
        print(f"gristmill dev: {exc}", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:
        print(f"gristmill dev failed: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        _shutdown(apps, kafka, pg, stop_signals.now)
        if lock is not None:
            lifeline().record_to(None)
            if not lifeline().held():
                with contextlib.suppress(FileNotFoundError):
                    (state_dir / RECORD_FILE).unlink()
            os.close(lock)
        lifeline().close()  # its watchdog exits too before we do


def _ledger_metrics_port(env: dict[str, str], configured: int) -> int:
    """The ledger's metrics port: the one set, else its default while free, else any free
    one (a second dev system, a test's, may hold the default)."""
    if "GRISTMILL_LEDGER_METRICS_PORT" in env or configured == 0 or port_free(configured):
        return configured
    return free_port()


def _grpc_note(port: int) -> str:
    if port <= 0:
        return "off (--grpc-port)"
    return f"127.0.0.1:{port}   (KServe v2 / Triton: tritonclient.grpc)"


def _ledger_note(port: int) -> str:
    where = f"http://127.0.0.1:{port}/metrics" if port else "metrics off"
    return f"{where}   (its account of a tenant: gristmill ledger export --help)"


def _unserved_note(url: str, served: list[str]) -> str:
    """A line naming the models ``GET /v1/models`` lists that no worker here serves
    (``--models`` left them out), or nothing."""
    try:
        listed = httpx.get(f"{url}/v1/models", timeout=10).json().get("data", [])
    except (httpx.HTTPError, ValueError):
        return ""
    names = {str(m.get("id", "")).split("@")[0] for m in listed}
    missing = sorted(names - {m.split("@")[0] for m in served})
    if not missing:
        return ""
    return (
        f"Not served here although GET /v1/models lists them: {', '.join(missing)} "
        f"(start with --models {','.join([*served, *missing])} to serve them).\n"
    )


def _shutdown(
    apps: _Apps, kafka: KafkaCluster | None, pg: PostgresServer | None, now: threading.Event
) -> None:
    """API, scheduler and ledger first (the scheduler still needs Kafka and PostgreSQL to
    finish its batch and commit), then Kafka and PostgreSQL; then anything still held."""
    if not apps.procs and kafka is None and pg is None and not lifeline().held():
        return
    started = time.monotonic()
    _say("stopping ... (Ctrl-C again to stop at once)")
    apps.stop(now)
    _stop_services(kafka, pg, now)
    running, survivors = lifeline().stop_all(grace_s=0)
    if running:
        _say(f"killed what was left: {'; '.join(running)}")
    if survivors:
        _say(f"still running after SIGKILL: {'; '.join(survivors)}")
    _say(f"stopped in {time.monotonic() - started:.1f} s")
