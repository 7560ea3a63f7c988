"""Freezes: SIGSTOP of one process (or server) for a while, then SIGCONT - a garbage
collector's pause, a hung disk, a VM stolen from its host. Unlike a kill nothing
restarts: the frozen thing wakes up with its state as it was, its sessions expired
around it, and must find its way back without losing or doubling anything.

* ``freeze-api``: every process of one API instance (its uvicorn group);
* ``freeze-scheduler``: one scheduler process (its workers run on, unanswered);
* ``freeze-worker``: one worker process, mid-batch or idle;
* ``freeze-broker``: one Kafka broker's JVM;
* ``freeze-postgres``: every PostgreSQL server process.

Each freeze lasts either a short pause (``SHORT_S``, inside every timeout) or a long one
(``LONG_S``, past the schedulers' 6 s consumer session in scheduler/runtime/lane.py, so a frozen
scheduler's partitions move to the other member while it sleeps, and a frozen broker is
fenced).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time

from gristmill.chaos.rig import Rig
from gristmill.devservices.procs import alive, children

FREEZE_KINDS = (
    "freeze-api",
    "freeze-scheduler",
    "freeze-worker",
    "freeze-broker",
    "freeze-postgres",
)
SHORT_S = 2.0
LONG_S = 8.0


def _signal_all(pids: list[int], sig: int, *, group: bool = False) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            (os.killpg if group else os.kill)(pid, sig)


def freeze(pids: list[int], seconds: float, *, group: bool = False) -> None:
    """SIGSTOP ``pids`` (process groups if ``group``), sleep, SIGCONT them."""
    _signal_all(pids, signal.SIGSTOP, group=group)
    try:
        time.sleep(seconds)
    finally:
        _signal_all(pids, signal.SIGCONT, group=group)


def target(rig: Rig, kind: str, rng: random.Random) -> tuple[str, list[int], bool] | None:
    """(the name recovery checks, pids, whether they are process groups) of one thing
    to freeze; None when there is none (no live worker, no such server)."""
    if kind == "freeze-api":
        name = rng.choice(rig.apis)
        return name, [rig.pid(name)], True  # uvicorn leads its own process group
    if kind == "freeze-scheduler":
        name = rng.choice(rig.schedulers)
        return name, [rig.pid(name)], False
    if kind == "freeze-worker":
        name = rng.choice(rig.schedulers)
        workers = [w for w in rig.workers(name) if alive(w)]
        if not workers:
            return None
        victim = rng.choice(workers)
        return f"{name}/{victim}", [victim], False
    if kind == "freeze-broker":
        kafka = rig.services.kafka
        if kafka is None:
            return None
        i = rng.randrange(kafka.n_brokers)
        pid = kafka.pid(i)
        return (f"broker-{i}", [pid], True) if pid is not None else None
    if kind == "freeze-postgres":
        pg = rig.services.postgres
        pid = pg.pid if pg is not None else None
        if pid is None:
            return None
        return "postgres", [pid, *children(pid)], False
    raise ValueError(f"not a freeze: {kind!r}")


def pause_s(rng: random.Random) -> float:
    return rng.choice((SHORT_S, LONG_S))
