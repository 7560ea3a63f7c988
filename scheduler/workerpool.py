"""The scheduler's side of its worker processes: spawn, accept, supervise.

Local workers are child processes started with ``python -m workers``; they
connect back over a Unix socket (so a worker started by hand with
``gristmill worker --socket ...`` joins the same way). A worker that dies is
restarted with backoff; its batch is handed back to the scheduler.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, Listener
from pathlib import Path

from workers.protocol import Hello, WorkBatch, WorkResult

log = logging.getLogger("gristmill.scheduler.workers")


class WorkerLost(Exception):
    """The worker died, hung past the batch timeout, or its connection broke."""


class WorkerHandle:
    def __init__(self, conn: Connection, hello: Hello, proc: subprocess.Popen[bytes] | None):
        self.conn = conn
        self.hello = hello
        self.proc = proc
        self.refs = {(m.name, m.version) for m in hello.models}
        self.alive = True

    @property
    def worker_id(self) -> str:
        return self.hello.worker_id

    def serves(self, ref: tuple[str, str]) -> bool:
        return ref in self.refs

    def run(self, batch: WorkBatch, timeout_s: float) -> WorkResult:
        """Send one batch and wait for its result (one batch at a time per worker)."""
        try:
            self.conn.send(batch)
            if not self.conn.poll(timeout_s):
                raise WorkerLost(
                    f"worker {self.worker_id} exceeded the {timeout_s:.0f}s batch timeout"
                )
            result: WorkResult = self.conn.recv()
            return result
        except (EOFError, OSError, BrokenPipeError) as exc:
            raise WorkerLost(f"worker {self.worker_id} died: {exc!r}") from exc
        except WorkerLost:
            self.kill()
            raise

    def kill(self) -> None:
        self.alive = False
        if self.hello.pid and self.hello.pid != os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.hello.pid, 9)
        self.conn.close()

    def stop(self) -> None:
        self.alive = False
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.conn.close()


class WorkerPool:
    def __init__(
        self,
        *,
        socket_path: Path,
        n_local: int,
        models: list[str],
        on_ready: Callable[[WorkerHandle], None],
        env: dict[str, str] | None = None,
    ):
        self.socket_path = socket_path
        self.authkey = secrets.token_bytes(32)
        self.n_local = n_local
        self.models = models
        self.on_ready = on_ready
        self.env = env or {}
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * n_local
        self._stopping = threading.Event()
        self._listener: Listener | None = None

    def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        if self.socket_path.exists():
            self.socket_path.unlink()
        self._listener = Listener(str(self.socket_path), family="AF_UNIX", authkey=self.authkey)
        (self.socket_path.parent / "worker.key").write_bytes(self.authkey)
        threading.Thread(target=self._accept_loop, name="worker-accept", daemon=True).start()
        for i in range(self.n_local):
            self._spawn(i)
        threading.Thread(target=self._supervise, name="worker-supervisor", daemon=True).start()

    def _spawn(self, i: int) -> None:
        env = {**os.environ, **self.env, "GRISTMILL_WORKER_AUTHKEY": self.authkey.hex()}
        cmd = [
            sys.executable,
            "-m",
            "workers",
            "--socket",
            str(self.socket_path),
            "--models",
            ",".join(self.models),
            "--worker-id",
            f"{os.getpid()}-w{i}",
        ]
        self._procs[i] = subprocess.Popen(cmd, env=env)
        log.info("spawned worker %d (pid %d)", i, self._procs[i].pid)  # type: ignore[union-attr]

    def _supervise(self) -> None:
        backoff = [1.0] * self.n_local
        while not self._stopping.wait(0.5):
            for i, proc in enumerate(self._procs):
                if proc is not None and proc.poll() is not None and not self._stopping.is_set():
                    log.warning(
                        "worker %d exited with %s; restarting in %.1fs",
                        i,
                        proc.returncode,
                        backoff[i],
                    )
                    time.sleep(backoff[i])
                    backoff[i] = min(backoff[i] * 2, 30.0)
                    self._spawn(i)

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                conn = self._listener.accept()
                hello = conn.recv()
            except (OSError, EOFError) as exc:
                if self._stopping.is_set():
                    return
                log.warning("worker handshake failed: %s", exc)
                continue
            if not isinstance(hello, Hello):
                conn.close()
                continue
            proc = next((p for p in self._procs if p is not None and p.pid == hello.pid), None)
            log.info(
                "worker %s ready: %s",
                hello.worker_id,
                ", ".join(f"{m.name}@{m.version}" for m in hello.models),
            )
            self.on_ready(WorkerHandle(conn, hello, proc))

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stopping.set()
        if self._listener is not None:
            self._listener.close()
        deadline = time.time() + timeout_s
        for proc in self._procs:
            if proc is None:
                continue
            try:
                proc.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                proc.kill()
