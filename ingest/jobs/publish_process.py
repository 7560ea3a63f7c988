"""A job's items put in Kafka from a process of their own (decision 74).

Publishing a job (``JobPublisher.publish_sync``: read the staged items back, encode
each as a request message, produce it) is CPU-bound Python. In a thread of the API
process that took the upload it holds the interpreter lock the event loop needs for
every sync request that process serves: on an H200 host, sync p95 went from 76 ms alone
to 318 ms beside a one-part million-item job (r15, docs/bench/gpu-host.md), and the job
ran at the pace the pacer (ingest/jobs/pacing.py) let that one thread keep.

So each API process hands its publishes to one child process, started on the first
job, at a lower CPU priority (``nice``): the job takes what the host's cores leave, and
the event loop never waits for the lock behind it. The child runs each publish in a
thread of its own, as the API process did, so a million-item job never holds up a small
one, with its own producer and database pool; a new job's staged file is read through
``/proc/<pid>/fd`` (the file has no name). When its API process is gone the child
finishes the publishes it holds and exits; when it exits, it ends the child.

Given the API process's pacer, the child paces by that process's event-loop lag, as
its threads would (ingest/jobs/pacing.py): the lag is mirrored into a shared value
every ``LAG_MIRROR_S``. Unpaced, it publishes as fast as its cores let it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.config import Settings
from ingest.jobs.pacing import Pacer

if TYPE_CHECKING:
    from ingest.jobs.upload import Staged

log = logging.getLogger(__name__)

# How much lower than the API's own the publishing process's CPU priority is.
NICE = 10
# How often the API process's loop lag is copied to its paced child (s): well inside a
# publish slice (ingest/jobs/pacing.py PUBLISH_SLICE, ~10 ms of work).
LAG_MIRROR_S = 0.005


@dataclass(frozen=True)
class StagedRef:
    """A new job's staged file as another process of this host can open it."""

    path: str
    count: int
    body_hash: str
    reused: frozenset[int]

    @classmethod
    def of(cls, staged: Staged) -> StagedRef | None:
        """None where the file cannot be reached by path (no /proc, a file-like object)."""
        try:
            fd = staged.file.fileno()
        except (AttributeError, OSError, ValueError):
            return None
        path = f"/proc/{os.getpid()}/fd/{fd}"
        if not Path(path).exists():
            return None
        return cls(path, staged.count, staged.body_hash, staged.reused)

    def open(self) -> Staged:
        from ingest.jobs.upload import Staged

        return Staged(open(self.path, "rb"), self.count, self.body_hash, self.reused)


def _publish(job_id: str, staged: StagedRef | None) -> int:
    assert _publisher is not None
    if staged is None:
        return _publisher.publish_sync(job_id)
    opened = staged.open()
    try:
        return _publisher.publish_sync(job_id, staged=opened)
    finally:
        opened.close()


_publisher: Any = None  # the child's JobPublisher


def _serve(conn: Connection, settings: Settings, lag: Any = None, target_ms: float = 0.0) -> None:
    """The child: each (id, job, staged file) received is published in a thread; its
    count, or the exception it raised, is sent back. Ends when the API process is gone.
    ``lag``: the API process's loop lag (a shared double, ms) to pace by, or None."""
    global _publisher
    from ingest.jobs.publisher import JobPublisher

    pacer = Pacer(lambda: float(lag.value), target_ms) if lag is not None else None
    _publisher = JobPublisher(settings, pacer)
    sending = threading.Lock()
    pool = ThreadPoolExecutor(settings.max_uploads + 2, thread_name_prefix="job-publish")

    def run(task: int, job_id: str, staged: StagedRef | None) -> None:
        try:
            reply: tuple[int, bool, Any] = (task, True, _publish(job_id, staged))
        except Exception as exc:
            reply = (task, False, exc)
        with sending:
            try:
                conn.send(reply)
            except OSError:  # the API process is gone; the job's heartbeat tells the rest
                pass
            except Exception:  # an exception that does not pickle: its words do
                conn.send((task, False, RuntimeError(repr(reply[2]))))

    while True:
        try:
            task, job_id, staged = conn.recv()
        except (EOFError, OSError):
            break
        pool.submit(run, task, job_id, staged)
    pool.shutdown(wait=True)  # what it holds is finished: nothing is left half sent
    _publisher.close()


class PublishProcess:
    """The API process's publishing child, started when the first job is sent."""

    def __init__(self, settings: Settings, pacer: Pacer | None = None):
        """``pacer``: the API process's, whose lag the child then paces by."""
        self.settings = settings
        self.pacer = pacer
        self._lock = threading.Lock()
        self._tasks = itertools.count()
        self._waiting: dict[int, Future[int]] = {}
        self._conn: Connection | None = None
        self._proc: Any = None
        self._lag: Any = None  # the shared lag the paced child reads (ms)

    def submit(self, job_id: str, staged: StagedRef | None) -> Future[int]:
        fut: Future[int] = Future()
        # Running from the start: a caller that stops waiting (its client went away)
        # cannot cancel it, so the reply always finds it settable, as a thread's would.
        fut.set_running_or_notify_cancel()
        with self._lock:
            if self._conn is None:
                self._start()
            assert self._conn is not None
            task = next(self._tasks)
            self._waiting[task] = fut
            try:
                self._conn.send((task, job_id, staged))
            except OSError:
                self._waiting.pop(task)
                fut.set_exception(BrokenProcessPool("the publishing process is gone"))
        return fut

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        ours, theirs = ctx.Pipe()
        lag = self._lag = ctx.Value("d", 0.0, lock=False) if self.pacer is not None else None
        target_ms = self.pacer.target_ms if self.pacer is not None else 0.0
        # A daemon: an API process that exits ends it (a publish it held is finished by the
        # stale-submission finisher) rather than wait for it; one killed outright cannot,
        # and the child then finishes what it holds and exits on its own.
        self._proc = ctx.Process(
            target=_serve,
            args=(theirs, self.settings, lag, target_ms),
            name="gristmill-job-publish",
            daemon=True,
        )
        self._proc.start()
        # Lowered from here, at once: its start-up (an interpreter and its imports) is
        # below the API's too, not only its work (bench.steady.first_seconds).
        with contextlib.suppress(OSError):
            os.setpriority(
                os.PRIO_PROCESS, self._proc.pid, os.getpriority(os.PRIO_PROCESS, 0) + NICE
            )
        theirs.close()
        self._conn = ours
        threading.Thread(target=self._replies, args=(ours,), daemon=True).start()
        if lag is not None and self.pacer is not None:
            threading.Thread(
                target=self._mirror, args=(ours, lag, self.pacer), name="lag-mirror", daemon=True
            ).start()

    def _mirror(self, conn: Connection, lag: Any, pacer: Pacer) -> None:
        """Copy this process's loop lag to the child while it is the one serving."""
        while self._conn is conn:
            lag.value = pacer.lag_ms()
            time.sleep(LAG_MIRROR_S)

    def _replies(self, conn: Connection) -> None:
        while True:
            try:
                task, ok, value = conn.recv()
            # TypeError: ``close`` closed this end while the read waited (multiprocessing
            # then reads from a handle that is None); the pipe has ended either way.
            except (EOFError, OSError, TypeError):
                break
            with self._lock:
                fut = self._waiting.pop(task, None)
            if fut is not None:
                fut.set_result(value) if ok else fut.set_exception(value)
        with self._lock:  # the child died: what it held fails over to the API process
            if self._conn is conn:
                self._conn = None
            waiting, self._waiting = self._waiting, {}
        if waiting:
            log.warning("the job publishing process ended with %d publishes held", len(waiting))
        for fut in waiting.values():
            fut.set_exception(BrokenProcessPool("the publishing process ended"))

    def close(self) -> None:
        """Ends the pipe: the child finishes what it holds and exits (unless this
        process's own exit ends it first)."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
