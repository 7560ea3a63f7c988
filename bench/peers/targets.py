"""The three systems under test, each started on loopback with 2 ``sim`` workers.

Every target gives the sweep the same handles: the infer URL and headers, cumulative
batch counters (batches, items, busy seconds), and the pids whose CPU it spends.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

import httpx

from bench.peers.procs import cpu_seconds, hold, listener_pid, stop_tree
from bench.peers.setup import REPO, peers_python
from bench.peers.stats import STATS_DIR_ENV, BatchTotals, read_totals
from core.config import Settings
from gristmill.devservices.ports import free_port

WORKERS = 2
MAX_BATCH = 100


class Target(ABC):
    name: str
    url: str = ""  # the infer endpoint
    headers: dict[str, str]
    workers = WORKERS

    def __init__(self) -> None:
        self.headers = {}
        self.stack = ExitStack()
        self.workdir = Path(self.stack.enter_context(tempfile.TemporaryDirectory(prefix="gmb-")))

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def batch_totals(self) -> BatchTotals: ...

    @abstractmethod
    def roles(self) -> dict[str, list[int]]:
        """Role -> pids whose CPU (with descendants) is that role's."""

    def stop(self) -> None:
        self.stack.close()

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(p) for pids in self.roles().values() for p in pids)

    def describe(self) -> dict[str, Any]:
        return {"workers": self.workers}

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            argv, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        hold(proc, f"{self.name} {name}")
        self.stack.callback(stop_tree, proc)
        return proc

    def _wait_http(self, url: str, proc: subprocess.Popen[Any], timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited; see {self.workdir}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{self.name} did not start within {timeout_s} s")


class GristmillTarget(Target):
    name = "gristmill"

    def start(self) -> None:
        from gristmill.devservices.stack import build_system, local_services
        from results.db import make_engine

        services = self.stack.enter_context(local_services(self.workdir))
        self.system = build_system(services, self.workdir)
        self.stack.callback(self.system.close)
        self.system.start_scheduler(workers=self.workers, models="sim")
        self.system.url = self.system.start_api(processes=self.system.settings.api_processes)
        self.system.wait_until_serving("sim")
        self.url = f"{self.system.url}/v1/infer"
        self.headers = {"Authorization": f"Bearer {self.system.keys['enterprise']}"}
        self.engine = make_engine(self.system.settings.database_url, pool_size=1)
        self.stack.callback(self.engine.dispose)
        kafka_port = int(services.bootstrap.split(",")[0].rsplit(":", 1)[1])
        pg_port = self.engine.url.port or 5432
        self._kafka, self._pg = listener_pid(kafka_port), listener_pid(pg_port)

    def batch_totals(self) -> BatchTotals:
        from sqlalchemy import text

        q = text(
            "select count(*), coalesce(sum(size), 0), coalesce(sum(compute_ms), 0) / 1000.0"
            " from batches where model = 'sim'"
        )
        with self.engine.connect() as c:
            b, i, s = c.execute(q).one()
        return BatchTotals(int(b), int(i), float(s))

    def roles(self) -> dict[str, list[int]]:
        procs = self.system.procs
        return {
            "api": [procs["api"].pid],
            "scheduler+workers": [procs["scheduler"].pid],
            "kafka": [self._kafka] if self._kafka else [],
            "postgres": [self._pg] if self._pg else [],
        }

    def describe(self) -> dict[str, Any]:
        s = self.system.settings
        return {
            "workers": self.workers,
            "api_processes": Settings().api_processes,
            "max_linger_ms": s.max_linger_ms,
            "max_batch": s.sim_max_batch,
            "topic_partitions": s.topic_partitions,
        }


class PlainTarget(Target):
    name = "plain"

    def start(self) -> None:
        port = free_port()
        stats = self.workdir / "stats"
        stats.mkdir()
        self.stats = stats
        argv = [sys.executable, "-m", "uvicorn", "bench.peers.plain_app:app"]
        argv += ["--host", "127.0.0.1", "--port", str(port), "--workers", str(self.workers)]
        argv += ["--log-level", "warning"]
        self.proc = self._spawn("plain", argv, {**os.environ, STATS_DIR_ENV: str(stats)})
        base = f"http://127.0.0.1:{port}"
        self._wait_http(f"{base}/healthz", self.proc)
        self.url = f"{base}/v1/infer"

    def batch_totals(self) -> BatchTotals:
        return read_totals(self.stats)

    def roles(self) -> dict[str, list[int]]:
        return {"server": [self.proc.pid]}

    def describe(self) -> dict[str, Any]:
        return {"workers": self.workers, "uvicorn_processes": self.workers, "slots_per_process": 1}


class RayTarget(Target):
    name = "ray"

    def __init__(self, max_batch: int = MAX_BATCH, wait_s: float = 0.05) -> None:
        super().__init__()
        self.max_batch, self.wait_s = max_batch, wait_s

    def start(self) -> None:
        if not peers_python().exists():
            raise RuntimeError("Ray Serve not installed: run python -m bench.sweep --setup-peers")
        port = free_port()
        self.stats = self.workdir / "stats"
        self.stats.mkdir()
        env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
        argv = [str(peers_python()), "-m", "bench.peers.ray_app", "--port", str(port)]
        argv += ["--stats-dir", str(self.stats), "--max-batch", str(self.max_batch)]
        argv += ["--wait-s", str(self.wait_s)]
        log = (self.workdir / "ray.log").open("ab")
        self.proc = subprocess.Popen(
            argv, env=env, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=log, text=True, start_new_session=True,
        )  # fmt: skip
        hold(self.proc, "Ray Serve")
        self.stack.callback(stop_tree, self.proc, 60)
        self.stack.callback(self._quit)
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=_pump, args=(self.proc.stdout, self._lines), daemon=True).start()
        self._expect("READY", 240)
        self.url = f"http://127.0.0.1:{port}/v1/infer"

    def configure(self, max_batch: int, wait_s: float) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"config {max_batch} {wait_s}\n")
        self.proc.stdin.flush()
        self._expect("OK", 120)
        self.max_batch, self.wait_s = max_batch, wait_s

    def _expect(self, word: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self._lines.get(timeout=1).strip() == word:
                    return
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"Ray Serve exited; see {self.workdir}/ray.log") from None
        raise RuntimeError(f"Ray Serve did not answer {word} within {timeout_s} s")

    def _quit(self) -> None:
        if self.proc.poll() is None and self.proc.stdin:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(60)  # serve.shutdown + ray.shutdown
            except (OSError, subprocess.TimeoutExpired):
                pass

    def batch_totals(self) -> BatchTotals:
        return read_totals(self.stats)

    def roles(self) -> dict[str, list[int]]:
        return {"ray": [self.proc.pid]}

    def describe(self) -> dict[str, Any]:
        return {
            "workers": self.workers,
            "replicas": self.workers,
            "max_batch_size": self.max_batch,
            "batch_wait_timeout_s": self.wait_s,
            "max_ongoing_requests": 1000,
        }


def _pump(stream: IO[str] | None, out: queue.Queue[str]) -> None:
    for line in stream or ():
        out.put(line)


def make_target(name: str) -> Target:
    kinds: dict[str, type[Target]] = {
        "gristmill": GristmillTarget,
        "plain": PlainTarget,
        "ray": RayTarget,
    }
    return kinds[name]()
