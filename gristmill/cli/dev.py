"""``gristmill dev``: the whole system on one machine, from nothing, in one command.

Starts a throwaway Kafka (KRaft, from Maven jars) and PostgreSQL (initdb) under
the state directory, unless KAFKA_BOOTSTRAP / DATABASE_URL point at real ones;
migrates; creates a ``dev`` tenant with a fresh key; starts the API and a
scheduler with its workers; checks one request end to end; prints how to call
it and writes ``.gristmill/dev.env``. Ctrl-C stops everything.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from core.config import settings_from_env
from core.redact import write_private
from gristmill.devservices import KafkaCluster, PostgresServer, free_port
from gristmill.devservices.stack import LOOPBACK_WEBHOOKS, api_command, scheduler_command


def _child(cmd: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    log = log_path.open("ab")
    return subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _wait_ready(
    url: str, key: str, model: str, timeout_s: float, procs: list[subprocess.Popen[bytes]]
) -> dict[str, object]:
    """Poll until one real request succeeds end to end."""
    deadline = time.time() + timeout_s
    last = "no answer yet"
    while time.time() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args!r} exited with {p.returncode}; see .gristmill/logs")
        try:
            r = httpx.post(
                f"{url}/v1/infer",
                json={"model": model, "input": "hello gristmill"},
                headers={"Authorization": f"Bearer {key}"},
                timeout=15,
            )
            if r.status_code == 200:
                body: dict[str, object] = r.json()
                return body
            last = f"{r.status_code} {r.text[:200]}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(1.0)
    raise RuntimeError(f"system did not become ready in {timeout_s:.0f}s: {last}")


def run_dev(state_dir: Path, *, port: int, workers: int, models: str) -> int:
    from core.topics import ensure_topics
    from gristmill.migrate import migrate_database
    from results.db import make_engine
    from results.tenants import Tenant, create_tenant, get_tenant, issue_key

    services = state_dir / "services"
    logs = state_dir / "logs"
    # A throwaway system: each run starts from clean data (see docs/architecture.md).
    shutil.rmtree(services, ignore_errors=True)
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    # A local broker and a throwaway database: allowed below production durability.
    env.setdefault("GRISTMILL_ALLOW_WEAK_DURABILITY", "true")
    env.setdefault("GRISTMILL_WEBHOOK_ALLOW_NETWORKS", LOOPBACK_WEBHOOKS)
    kafka: KafkaCluster | None = None
    pg: PostgresServer | None = None
    procs: list[subprocess.Popen[bytes]] = []
    stop = threading.Event()
    running = threading.Event()

    def on_signal(*_: object) -> None:
        stop.set()
        if not running.is_set():  # still starting up: abort right away
            raise KeyboardInterrupt

    # SIGINT explicitly too: a backgrounded process inherits it ignored.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        if "KAFKA_BOOTSTRAP" not in env:
            print("starting Kafka (KRaft) ...", flush=True)
            kafka = KafkaCluster(services / "kafka", n_brokers=1, partitions=6)
            kafka.start()
            env["KAFKA_BOOTSTRAP"] = kafka.bootstrap
        if "DATABASE_URL" not in env:
            print("starting PostgreSQL ...", flush=True)
            pg = PostgresServer(services / "postgres")
            pg.start()
            env["DATABASE_URL"] = pg.url
        settings = settings_from_env(env)
        migrate_database(settings)
        ensure_topics(settings)
        with make_engine(settings.database_url).begin() as conn:
            try:
                tenant: Tenant = get_tenant(conn, "dev")
            except Exception:
                tenant = create_tenant(conn, "dev", "enterprise")
            _, key = issue_key(conn, tenant)

        api_port = port or free_port()
        url = f"http://127.0.0.1:{api_port}"
        print(
            f"starting API on {url} and a scheduler with {workers} worker(s) [{models}] ...",
            flush=True,
        )
        procs.append(_child(api_command(api_port, settings.api_processes), env, logs / "api.log"))
        procs.append(
            _child(
                scheduler_command(workers, models, state_dir / "run"), env, logs / "scheduler.log"
            )
        )
        answer = _wait_ready(url, key, "sim", 300, procs)

        write_private(
            state_dir / "dev.env",
            f"GRISTMILL_URL={url}\nGRISTMILL_API_KEY={key}\n"
            f"KAFKA_BOOTSTRAP={env['KAFKA_BOOTSTRAP']}\nDATABASE_URL={env['DATABASE_URL']}\n",
        )
        print(
            f"""
Gristmill is running.
  API:       {url}   (docs at {url}/docs)
  API key:   {key}
  Kafka:     {env["KAFKA_BOOTSTRAP"]}
  Postgres:  {env["DATABASE_URL"]}
  Logs:      {logs}
  Env file:  {state_dir / "dev.env"}

Try it:
  curl -s {url}/v1/infer -H 'Authorization: Bearer {key}' \\
       -H 'Content-Type: application/json' -d '{{"model": "sim", "input": "hello"}}'

First answer: {answer.get("output")}  (batch of {answer.get("batch_size")})
Press Ctrl-C to stop.""",
            flush=True,
        )
        while not stop.is_set():
            for p in procs:
                if p.poll() is not None:
                    print(f"{p.args!r} exited with {p.returncode}; stopping", flush=True)
                    stop.set()
            stop.wait(1.0)
        return 0
    except KeyboardInterrupt:
        return 0
    except Exception as exc:
        print(f"gristmill dev failed: {exc}", file=sys.stderr)
        return 1
    finally:
        print("stopping ...", flush=True)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        if kafka is not None:
            kafka.stop()
        if pg is not None:
            pg.stop()
