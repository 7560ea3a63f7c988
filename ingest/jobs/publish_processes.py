"""A job's items put in Kafka from a process of their own (decision 74).

Publishing a job (``JobPublisher.publish_sync``: read the staged items back, encode
each as a request message, produce it) is CPU-bound Python. In a thread of the API
process that took the upload it holds the interpreter lock the event loop needs for
every sync request that process serves: on an H200 host, sync p95 went from 76 ms alone
to 318 ms beside a one-part million-item job (r15, docs/bench/gpu-host.md), and the job
ran at the pace the pacer (ingest/jobs/pacing.py) let that one thread keep.

So each API process hands its publishes to a small pool of child processes, started
on the first job, at a lower CPU priority (``nice``): the job takes what the host's
cores leave, and the event loop never waits for the lock behind it. A child publishes
exactly what the thread did (same code, its own producer and database pool); a new
job's staged file is read by the child through ``/proc/<pid>/fd`` (the file has no name).
A child whose API process is gone exits; a publish it leaves half done is finished by
the stale-submission finisher like any crashed publish (decision 10).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from core.config import Settings

if TYPE_CHECKING:
    from ingest.jobs.publisher import JobPublisher
    from ingest.jobs.upload import Staged

# How much lower than the API's own the publishing processes' CPU priority is.
NICE = 10
_PARENT_CHECK_S = 1.0


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


_publisher: JobPublisher | None = None


def _start(settings: Settings, parent: int) -> None:
    """A publishing process's start: lower priority, its own publisher, and a watch on
    the API process that started it."""
    global _publisher
    with contextlib.suppress(OSError):
        os.nice(NICE)
    from ingest.jobs.publisher import JobPublisher

    _publisher = JobPublisher(settings)
    threading.Thread(target=_exit_with, args=(parent,), daemon=True, name="parent").start()


def _exit_with(parent: int) -> None:
    # The pool's queues keep both ends of their pipes here, so a parent killed outright
    # would not be noticed by a child waiting for work.
    while os.getppid() == parent:
        time.sleep(_PARENT_CHECK_S)
    os._exit(0)


def _publish(job_id: str, staged: StagedRef | None) -> int:
    assert _publisher is not None, "started by _start"
    if staged is None:
        return _publisher.publish_sync(job_id)
    opened = staged.open()
    try:
        return _publisher.publish_sync(job_id, staged=opened)
    finally:
        opened.close()


class PublishProcesses:
    """``processes`` child processes publishing jobs, started when the first is sent."""

    def __init__(self, settings: Settings, processes: int):
        self.settings = settings
        self.processes = processes
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def submit(self, job_id: str, staged: StagedRef | None) -> Future[int]:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    max_workers=self.processes,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start,
                    initargs=(self.settings, os.getpid()),
                )
            return self._pool.submit(_publish, job_id, staged)

    def discard(self) -> None:
        """The pool broke (a child died): the next publish starts a new one."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """A publish still running in a child is left to it; once this process is gone
        the child exits, and the stale-submission finisher completes the job."""
        self.discard()
