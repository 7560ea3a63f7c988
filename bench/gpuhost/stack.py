"""Kafka (KRaft, three brokers), PostgreSQL (durable) and ``gristmill host`` on the GPU
machine, from the parts ``bench/gpuhost/device.sh`` unpacked; tenants and keys."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.gpuhost.corpora import MAX_BATCH, MODEL
from bench.gpuhost.measure import Cpu
from core.config import settings_from_env
from core.topics import ensure_topics
from gristmill.devservices import KafkaCluster, PostgresServer, free_port
from gristmill.devservices.pg_sizing import host_settings
from gristmill.hostshape import partitions_for, shape_host
from gristmill.migrate import migrate_database
from results.db import make_engine
from results.tenants import create_tenant, issue_key, set_plan

HOST_ROOT = Path(os.environ.get("GMHOST_ROOT", "/opt/gmhost"))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Stack:
    def __init__(self, work: Path, args: argparse.Namespace) -> None:
        self.work = work
        self.args = args
        self.kafka: KafkaCluster | None = None
        self.pg: PostgresServer | None = None
        self.host: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}
        self.keys: dict[str, str] = {}
        self.url = ""
        # What ``gristmill host`` serves: the embedding model, and the causal LM
        # beside it when a scenario generates (run.py).
        self.models = MODEL
        self.schedulers = 0
        self.api_processes = 0
        self._launches = 0
        self.extra_env: dict[str, str] = {}  # settings a scenario needs, over the defaults

    def start(self) -> dict[str, Any]:
        cores = len(os.sched_getaffinity(0))
        gpus = len(_visible_gpus())
        shape = shape_host(
            cores,
            gpus,
            colocated=True,
            reserve_cores=self.args.loadgen_cores,
            api_processes=self.args.api_processes or None,
            schedulers=self.args.schedulers or None,
            workers_per_gpu=self.args.workers_per_gpu,
        )
        self.api_processes = shape.api_processes
        partitions = partitions_for(shape.schedulers, minimum=self.args.partitions)
        log(f"shape: {shape}")
        self.kafka = KafkaCluster(
            self.work / "kafka",
            n_brokers=self.args.brokers,
            partitions=partitions,
            libs_dir=HOST_ROOT / "kafka-libs",
            java=str(HOST_ROOT / "jre/bin/java"),
            extra_jvm_opts=("-Xmx2g", "-Xms1g"),
            extra_config={"num.network.threads": 4, "num.io.threads": 8},
        )
        pg_dir = Path(tempfile.mkdtemp(prefix="gmhost-pg-"))
        pg_dir.chmod(0o711)
        sized = self.args.pg_conf == "host"
        pg_settings = host_settings(psutil.virtual_memory().total, shutil.disk_usage(pg_dir).free)
        self.pg = PostgresServer(
            pg_dir, fast=False, max_connections=500, settings=pg_settings if sized else None
        )
        self.pg_settings = pg_settings if sized else {}
        log(f"PostgreSQL settings: {self.pg_settings or 'defaults'}")
        t0 = time.time()
        self.kafka.start(timeout_s=120)
        self.pg.start()
        log(f"Kafka ({self.args.brokers} brokers) and PostgreSQL up in {time.time() - t0:.0f} s")
        run = uuid.uuid4().hex[:6]
        self.env = {
            **os.environ,
            "KAFKA_BOOTSTRAP": self.kafka.bootstrap,
            "DATABASE_URL": self.pg.url,
            "GRISTMILL_TOPIC_PREFIX": f"gm-{run}",
            "GRISTMILL_CONSUMER_GROUP": f"gm-{run}",
            "GRISTMILL_TOPIC_PARTITIONS": str(partitions),
            "GRISTMILL_TOPIC_REPLICATION": str(min(3, self.args.brokers)),
            "GRISTMILL_EMBED_MAX_BATCH": str(MAX_BATCH),
            "GRISTMILL_WORKER_MODELS": self.models,
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }
        if self.args.brokers < 3:  # a smoke run on one broker: below what production needs
            self.env["GRISTMILL_ALLOW_WEAK_DURABILITY"] = "true"
        settings = settings_from_env(self.env)
        migrate_database(settings)
        ensure_topics(settings)
        with make_engine(settings.database_url).begin() as conn:
            for tier in ("enterprise", "paid", "free"):
                t = create_tenant(conn, f"{tier}-{run}", tier)
                set_plan(conn, t.name, rate_rps=1e6, burst=1e6, job_items_per_s=1e9)
                self.keys[tier] = issue_key(conn, t)[1]
        self.schedulers = shape.schedulers
        self._launch(self.env)
        self._wait_served()
        return {
            "shape": {
                "api_processes": shape.api_processes,
                "schedulers": shape.schedulers,
                "workers": shape.workers,
                "reasons": shape.reasons,
            },
            "partitions": partitions,
            "brokers": self.args.brokers,
            "postgres": self.pg_settings,
            "start_s": round(time.time() - t0, 1),
        }

    def _launch(self, env: dict[str, str]) -> None:
        """``gristmill host`` on a fresh port and run directory (a restart's own)."""
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        run_dir = self.work / ("host" if not self._launches else f"host-{self._launches}")
        self._launches += 1
        argv = [
            sys.executable, "-m", "gristmill", "host", "--models", self.models, "--colocated",
            "--reserve-cores", str(self.args.loadgen_cores), "--port", str(port),
            "--run-dir", str(run_dir), "--schedulers", str(self.schedulers),
            "--api-processes", str(self.api_processes),
            "--workers-per-gpu", str(self.args.workers_per_gpu),
        ]  # fmt: skip
        self.host = subprocess.Popen(
            argv,
            env=env,
            stdout=(self.work / "host.log").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def restart_host(self, extra_env: dict[str, str]) -> float:
        """``gristmill host`` stopped and started again with ``extra_env`` over the
        stack's environment (Kafka, PostgreSQL, topics and tenants kept); seconds until
        it served again."""
        t0 = time.time()
        self._stop_host()
        self._launch({**self.env, **extra_env})
        self._wait_served()
        return round(time.time() - t0, 1)

    def _wait_served(self, timeout_s: float = 300) -> None:
        deadline = time.time() + timeout_s
        last = ""
        while time.time() < deadline:
            assert self.host is not None
            if self.host.poll() is not None:
                raise RuntimeError(f"gristmill host exited {self.host.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.post(
                    f"{self.url}/v1/infer",
                    headers=self.headers(),
                    json={"model": MODEL, "input": "warm up"},
                    timeout=30,
                )
                if r.status_code == 200:
                    return
                last = r.text[:200]
            time.sleep(1)
        raise RuntimeError(f"{MODEL} not served in time: {last}")

    def dsn(self) -> str:
        """The libpq URL of the stack's database."""
        from results.db import libpq_url

        return libpq_url(settings_from_env(self.env).database_url)

    def refusals(self, t0: float, t1: float, by_second: bool = False) -> Any:
        """What the API refused between t0 and t1 (epoch s), by status and reason, from
        the request log's refusal counts (written about once a second)."""
        import psycopg

        second = "floor(extract(epoch FROM at) - %(t0)s)::int" if by_second else "0"
        with psycopg.connect(self.dsn()) as conn:
            rows = conn.execute(
                f"SELECT {second}, status, reason, sum(count) FROM refusals "
                "WHERE at >= to_timestamp(%(t0)s) - interval '1 second' "
                "AND at < to_timestamp(%(t1)s) GROUP BY 1, 2, 3 ORDER BY 1",
                {"t0": t0, "t1": t1},
            ).fetchall()
        if not by_second:
            return {f"{status} {reason}": int(n) for _, status, reason, n in rows}
        return [(s, f"{status} {reason}", int(n)) for s, status, reason, n in rows]

    def headers(self, tier: str = "enterprise") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tier]}"}

    def cpu(self) -> Cpu:
        assert self.host is not None and self.kafka is not None and self.pg is not None
        pids = [n.proc.pid for n in self.kafka._nodes if n.proc is not None]
        return Cpu(self.host.pid, pids, self.pg)

    def stop(self) -> None:
        self._stop_host()
        if self.kafka is not None:
            self.kafka.stop()
        if self.pg is not None:
            self.pg.stop()

    def _stop_host(self) -> None:
        if self.host is not None and self.host.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.host.pid, 15)
            try:
                self.host.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.host.pid, 9)


def _visible_gpus() -> list[str]:
    from gristmill.cli.host import host_gpus

    return host_gpus()
