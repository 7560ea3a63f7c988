"""Workers forked by the scheduler's spawner thread die with the scheduler process,
not with the thread that asked for them (PR_SET_PDEATHSIG is per thread)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from gristmill.devservices.procs import alive, wait_gone

REPO = Path(__file__).resolve().parents[2]
# What a worker does at start (workers/process.py): SIGKILL me when my parent dies.
CHILD = textwrap.dedent(
    """
    import ctypes, signal, time
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    time.sleep(300)
    """
)
# A scheduler-like parent: one worker through the spawner, one by a plain Popen, each
# asked for from a thread that lives on a while (the worker has called prctl by then)
# and then ends, as the supervisor thread does when shutdown begins.
PARENT = textwrap.dedent(
    """
    import os, subprocess, sys, threading, time
    from scheduler.runtime.spawner import Spawner
    child = [sys.executable, "-c", sys.argv[1]]
    spawner, out = Spawner(), {}
    def via_spawner(): out["spawner"] = spawner.popen(child, dict(os.environ)); time.sleep(1.5)
    def plain(): out["plain"] = subprocess.Popen(child); time.sleep(1.5)
    for fn in (via_spawner, plain):
        t = threading.Thread(target=fn); t.start(); t.join()
    print(out["spawner"].pid, out["plain"].pid, flush=True)
    time.sleep(300)
    """
)


def test_spawned_worker_outlives_the_asking_thread_but_not_the_process() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        spawned, plain = map(int, parent.stdout.readline().split())
        time.sleep(0.5)
        assert not alive(plain), "the kernel did not kill the plain thread's child"
        assert alive(spawned), "the spawner's worker died with the thread that asked for it"
        parent.kill()
        parent.wait()
        assert wait_gone([spawned], 5), "the worker outlived its scheduler"
    finally:
        if parent.poll() is None:
            parent.kill()
