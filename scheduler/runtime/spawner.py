"""Worker processes are forked by one thread that lives as long as the scheduler.

A worker asks the kernel to kill it when its parent dies (PR_SET_PDEATHSIG, set in
``workers.process``), but Linux sends that signal when the *thread* that forked the
worker exits, not the process. Workers restarted by the supervisor thread were killed
the moment that thread returned (it returns when shutdown begins), in the middle of
the drain. Forked from this thread instead, every worker lives exactly as long as the
scheduler process, and dies with it however it ends.
"""

from __future__ import annotations

import queue
import subprocess
import threading
from concurrent.futures import Future

from scheduler.runtime.supervisor import Supervisor


class Spawner:
    """``popen`` runs ``subprocess.Popen`` on the spawner's own thread (a daemon: it
    never returns, so it ends only with the process) and hands back the child."""

    def __init__(self, supervisor: Supervisor | None = None) -> None:
        self._supervisor = supervisor or Supervisor()
        self._jobs: queue.SimpleQueue[
            tuple[list[str], dict[str, str], Future[subprocess.Popen[bytes]]]
        ] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None:
                self._thread = self._supervisor.start(self._run, name="worker-spawner")
        done: Future[subprocess.Popen[bytes]] = Future()
        self._jobs.put((cmd, env, done))
        return done.result()

    def _run(self) -> None:
        while True:
            cmd, env, done = self._jobs.get()
            try:
                done.set_result(subprocess.Popen(cmd, env=env))
            except BaseException as exc:  # handed to the caller, which raises it
                done.set_exception(exc)
