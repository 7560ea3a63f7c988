"""What an earlier run left in a state directory, found and stopped before a new start.

The lifeline's watchdog normally stops everything within seconds of a run's death
(decision 28); this is for when it could not (it was killed too, or the run predates
it). A run keeps, in its state directory:

* ``dev.lock``: an exclusive ``flock`` while it runs; the kernel drops it when the run's
  process dies, however it dies, so a lock we cannot take means a live run;
* ``dev.pids``: the lifeline's record of what the run holds (process groups with their
  leaders' start times, the PostgreSQL data directory), and the run's own pid.

Before a new run deletes ``services/``, everything recorded is stopped, then the
PostgreSQL of that data directory (by its ``postmaster.pid``) and any process still
working inside ``services/`` (a Kafka JVM runs in its node folder, PostgreSQL in its
data directory). If any of it survives SIGKILL, nothing is deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from gristmill.devservices.lifeline import GRACE_S, KILL_WAIT_S, PgData, Target, from_json, stop
from gristmill.devservices.procs import alive, cmdline, sigkill, wait_gone, working_in

LOCK_FILE = "dev.lock"
RECORD_FILE = "dev.pids"


class StateDirError(RuntimeError):
    """The state directory is in use, or holds a server we could not stop."""


def read_record(path: Path) -> tuple[int | None, list[Target]]:
    """(pid of the run that wrote it, what it held); (None, []) if there is none."""
    try:
        body = json.loads(path.read_text())
        owner = body.get("owner", {}).get("pid")
        return (int(owner) if owner else None), [from_json(t) for t in body.get("targets", [])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None, []


def lock_state_dir(state_dir: Path) -> int:
    """Take the state directory for this run (the fd holds the lock until we exit)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        owner, targets = read_record(state_dir / RECORD_FILE)
        running = "; ".join(t.label for t in targets) or "its services"
        who = f"gristmill dev (pid {owner})" if owner else "gristmill dev"
        how = f"Ctrl-C in its terminal, or kill {owner}" if owner else "Ctrl-C in its terminal"
        raise StateDirError(
            f"another {who} is running with state directory {state_dir} ({running}).\n"
            f"Stop it first ({how}), or run a second one beside it with its own "
            f"--state-dir and --port."
        ) from None
    return fd


def stop_leftovers(
    state_dir: Path, services: Path, say: Callable[[str], None], grace_s: float = GRACE_S
) -> None:
    """Stop whatever an earlier run left; raise StateDirError if something survives."""
    owner, targets = read_record(state_dir / RECORD_FILE)
    pg = PgData(str((services / "postgres" / "data").resolve()), "PostgreSQL")
    if all(t.key != pg.key for t in targets):  # a run that predates its record, say
        targets.append(pg)
    running, survivors = stop(targets, grace_s=grace_s)
    for what in running:
        say(f"stopped a leftover of an earlier run{f' (pid {owner})' if owner else ''}: {what}")
    if services.is_dir():
        strays = working_in(services)
        for pid in strays:
            say(f"stopping pid {pid}, still running in {services}: {cmdline(pid)}")
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
        if strays and not wait_gone(strays, grace_s):
            for pid in strays:
                sigkill(pid)
            wait_gone(strays, KILL_WAIT_S)
        survivors += [f"pid {pid} ({cmdline(pid)})" for pid in strays if alive(pid)]
    if survivors:
        raise StateDirError(
            f"processes of an earlier run still run after SIGKILL: {'; '.join(survivors)}.\n"
            f"Not deleting {services} under them; stop them and start again."
        )
    with contextlib.suppress(FileNotFoundError):
        (state_dir / RECORD_FILE).unlink()


def wait_port_released(is_free: Callable[[], bool], timeout_s: float) -> bool:
    """A killed server's port is free once the kernel closed its socket (milliseconds)."""
    deadline = time.monotonic() + timeout_s
    while not is_free():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
