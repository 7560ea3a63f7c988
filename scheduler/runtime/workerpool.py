"""The scheduler's side of its worker processes: spawn, accept, supervise.

Local workers are child processes started with ``python -m workers``; they
connect back over a Unix socket (so a worker started by hand with
``gristmill worker --socket ...`` joins the same way). A worker that dies is
restarted; its batch is handed back to the scheduler. Only a worker that dies
before it ever became ready (a crash loop at start-up) backs off exponentially:
one that served and was then killed, or crashed on a poison input (which the
retry policy bounds), is replaced at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import secrets
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection, Listener
from pathlib import Path

from core.framing import WholeReader
from core.protocol import (
    GenStep,
    GenStepResult,
    Hello,
    ModelCommand,
    ModelStatus,
    WorkBatch,
    WorkResult,
)
from core.redact import write_private
from core.vocab import ModelRef
from scheduler.runtime.spawner import Spawner
from scheduler.runtime.supervisor import Supervisor

log = logging.getLogger(__name__)

RESTART_INITIAL_S = 0.2
RESTART_MAX_S = 30.0


class WorkerLost(Exception):
    """The worker died, hung past the batch timeout, or its connection broke.

    ``ran`` is False when the batch never reached the worker (it was already dead):
    then the batch is not to blame and goes back unchanged.
    """

    def __init__(self, message: str, *, ran: bool = True):
        super().__init__(message)
        self.ran = ran


StatusHandler = Callable[["WorkerHandle", ModelStatus], None]


class WorkerHandle:
    """One worker's connection. ``send`` queues a batch on the worker and ``receive``
    returns results in the order the batches were sent; they may be called from two
    threads (one sending, one receiving), so a batch can be sent while the one before
    it computes (decision 0012). ``run`` is both, for one batch at a time.

    A reader thread takes everything the worker sends: results go to ``receive`` in
    order, a version's status (loading, ready, unavailable, failed, unloaded) to
    ``on_status`` as it comes, whether or not a batch is out."""

    def __init__(
        self,
        conn: Connection,
        hello: Hello,
        proc: subprocess.Popen[bytes] | None,
        on_status: StatusHandler | None = None,
        supervisor: Supervisor | None = None,
    ):
        self.conn = conn
        self.hello = hello
        self.proc = proc
        self.refs = {ModelRef(m.name, m.version) for m in hello.models}
        self.alive = True
        self.on_status = on_status
        self._sent: deque[tuple[str, float]] = deque()  # (batch id, sent at), in order
        self._last_result_at = 0.0  # monotonic
        self._send_lock = threading.Lock()
        self._results: queue.Queue[WorkResult | GenStepResult | BaseException] = queue.Queue()
        (supervisor or Supervisor()).start(self._read, name=f"read-{hello.worker_id}")

    def _read(self) -> None:
        reader = WholeReader(self.conn)  # a batch's answers in one wait (core/framing.py)
        try:
            self._read_from(reader)
        finally:
            reader.release()

    def _read_from(self, reader: WholeReader) -> None:
        while True:
            try:
                msg = reader.recv()
            except (EOFError, OSError) as exc:
                self._results.put(exc)
                return
            if isinstance(msg, ModelStatus):
                handler = self.on_status
                if handler is not None:
                    try:
                        handler(self, msg)
                    except Exception:  # a bug in the handler must not stop the results
                        log.exception("model status from %s not handled", self.worker_id)
                continue
            self._results.put(msg)

    @property
    def worker_id(self) -> str:
        return self.hello.worker_id

    @property
    def in_flight(self) -> int:
        """Batches sent whose result has not been received."""
        return len(self._sent)

    def serves(self, ref: tuple[str, str]) -> bool:
        return ref in self.refs

    def run(self, batch: WorkBatch, timeout_s: float) -> WorkResult:
        """Send one batch and wait for its result (nothing else in flight)."""
        self.send(batch)
        return self.receive(timeout_s)

    def command(self, msg: ModelCommand) -> bool:
        """Ask the worker to load or unload a version; False if it is gone."""
        with self._send_lock:
            try:
                self.conn.send(msg)
            except (OSError, ValueError):
                return False
        return True

    def send(self, batch: WorkBatch | GenStep) -> None:
        """Queue ``batch`` on the worker; it runs its batches one at a time, in order.
        ``WorkerLost(ran=False)`` if the worker is already gone."""
        if self.proc is not None and self.proc.poll() is not None:
            self.alive = False
            raise WorkerLost(f"worker {self.worker_id} is gone", ran=False)
        with self._send_lock:
            entry = (batch.batch_id, time.monotonic())
            self._sent.append(entry)  # before the bytes go: a result may come back at once
            try:
                self.conn.send(batch)
            except (OSError, ValueError) as exc:
                self.alive = False
                with contextlib.suppress(ValueError):
                    self._sent.remove(entry)
                raise WorkerLost(f"worker {self.worker_id} is gone: {exc!r}", ran=False) from exc

    def receive(self, timeout_s: float) -> WorkResult:
        result = self._receive(timeout_s)
        assert isinstance(result, WorkResult)
        return result

    def receive_step(self, timeout_s: float) -> GenStepResult:
        """A generation step's result (a worker of a generation model gets only steps)."""
        result = self._receive(timeout_s)
        if not isinstance(result, GenStepResult):
            self.kill()
            raise WorkerLost(f"the worker answered a step with {type(result).__name__}")
        return result

    def _receive(self, timeout_s: float) -> WorkResult | GenStepResult:
        """The result of the oldest batch in flight. That batch started when it was sent
        or when the result before it came back, whichever was later; if no result comes
        within ``timeout_s`` of that, the worker hung and is killed."""
        batch_id, sent_at = self._sent[0]
        started = max(sent_at, self._last_result_at)
        left = started + timeout_s - time.monotonic()
        try:
            got = self._results.get(timeout=max(left, 0.001))
        except queue.Empty:
            self.kill()
            raise WorkerLost(
                f"the worker hung: no result within the {timeout_s:g}s batch timeout"
            ) from None
        if isinstance(got, BaseException):
            self._results.put(got)  # every later receive sees the connection is gone
            self.alive = False
            code = self.proc.poll() if self.proc is not None else None
            how = f"exit status {code}" if code is not None else repr(got)
            raise WorkerLost(f"the worker process crashed while running it ({how})") from got
        result = got
        if result.batch_id != batch_id:
            self.kill()
            raise WorkerLost(f"the worker answered batch {result.batch_id}, not {batch_id}")
        self._sent.popleft()
        self._last_result_at = time.monotonic()
        return result

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
        on_status: StatusHandler | None = None,
        preload: bool = True,
        supervisor: Supervisor | None = None,
    ):
        self.socket_path = socket_path
        self.authkey = secrets.token_bytes(32)
        self.n_local = n_local
        self.models = models
        self.on_ready = on_ready
        self.on_status = on_status
        # True: spawned workers load their models' built-in versions before they say
        # hello; False: they wait for the model control's LoadModel (the registry's).
        self.preload = preload
        self.env = env or {}
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * n_local
        self._ready_pids: set[int] = set()  # workers that completed their handshake
        self._stopping = threading.Event()
        self._no_restarts = threading.Event()
        self._listener: Listener | None = None
        self._supervisor = supervisor or Supervisor()
        self._spawner = Spawner(self._supervisor)  # workers die with this process

    def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        if self.socket_path.exists():
            self.socket_path.unlink()
        self._listener = Listener(str(self.socket_path), family="AF_UNIX", authkey=self.authkey)
        write_private(self.socket_path.parent / "worker.key", self.authkey)
        self._supervisor.start(self._accept_loop, name="worker-accept")
        for i in range(self.n_local):
            self._spawn(i)
        self._supervisor.start(self._supervise, name="worker-restarts")

    def _spawn(self, i: int) -> None:
        env = {
            **os.environ,
            **self.env,
            "GRISTMILL_WORKER_AUTHKEY": self.authkey.hex(),
            # Lets the worker ask the kernel to kill it if we die (even while it hangs).
            "GRISTMILL_WORKER_PARENT_PID": str(os.getpid()),
        }
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
            *([] if self.preload else ["--no-preload"]),
        ]
        self._procs[i] = self._spawner.popen(cmd, env)
        log.info("spawned worker %d (pid %d)", i, self._procs[i].pid)  # type: ignore[union-attr]

    def stop_restarts(self) -> None:
        """Shutting down: workers that exit now stay down. Safe in a signal handler."""
        self._no_restarts.set()

    def _supervise(self) -> None:
        backoff = [RESTART_INITIAL_S] * self.n_local
        restart_at: list[float | None] = [None] * self.n_local
        while not self._stopping.wait(0.2):
            now = time.monotonic()
            for i, proc in enumerate(self._procs):
                if self._no_restarts.is_set():
                    return
                at = restart_at[i]
                if at is not None:
                    if now >= at:
                        restart_at[i] = None
                        self._spawn(i)
                    continue
                if proc is None or proc.poll() is None:
                    continue
                # A worker that got ready was not crash-looping: replace it at once.
                if proc.pid in self._ready_pids:
                    self._ready_pids.discard(proc.pid)
                    backoff[i] = RESTART_INITIAL_S
                delay = backoff[i]
                backoff[i] = min(backoff[i] * 2, RESTART_MAX_S)
                log.warning(
                    "worker %d exited with %s; restarting in %.1fs", i, proc.returncode, delay
                )
                restart_at[i] = now + delay

    def warming(self) -> int:
        """Spawned workers still loading and warming up (alive, no handshake yet)."""
        return sum(
            1
            for p in list(self._procs)
            if p is not None and p.poll() is None and p.pid not in self._ready_pids
        )

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
            if proc is not None:
                self._ready_pids.add(proc.pid)
            log.info(
                "worker %s ready: %s",
                hello.worker_id,
                ", ".join(f"{m.name}@{m.version}" for m in hello.models),
            )
            self.on_ready(WorkerHandle(conn, hello, proc, self.on_status, self._supervisor))

    def stop(self, timeout_s: float = 10.0) -> None:
        self._no_restarts.set()
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
