"""Fault injectors: each kills one thing the hard way and brings it back.

* ``scheduler``: SIGKILL of one scheduler process (its workers notice and exit);
  the other member must take its partitions over; then it is started again.
* ``worker``: SIGKILL of one worker process mid-whatever; its scheduler hands the
  batch back and restarts the worker.
* ``api``: SIGKILL of one API instance; restarted on the same port.
* ``broker``: SIGKILL of one of the three Kafka brokers; restarted after a while.
* ``postgres``: a fast restart, or a crash (SIGKILL of every server process) and
  start; either way every connection breaks.
* ``freeze-<kind>``: SIGSTOP and, after a short or a long pause, SIGCONT of one API
  instance, scheduler, worker, broker or the PostgreSQL server (gristmill/chaos/freezes.py).
* ``cut-scheduler`` / ``cut-api``: the scheduler or API that runs in a network namespace
  of its own is cut off from Kafka, PostgreSQL or both for ``CUT_S``, then joined again
  (gristmill/chaos/netns.py; only where the machine allows namespaces).
"""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass

from gristmill.chaos import freezes
from gristmill.chaos.rig import Rig
from gristmill.devservices.procs import alive, sigkill, wait_gone

KILLS = ("scheduler", "worker", "api", "broker", "postgres")
# Partitions: a scheduler or API in a network namespace cut off from Kafka, PostgreSQL
# or both for CUT_S (past the 6 s consumer session), then joined again (chaos/netns.py).
CUTS = ("cut-scheduler", "cut-api")
CUT_S = 8.0
KINDS = (*KILLS, *freezes.FREEZE_KINDS, *CUTS)
# How long the killed thing stays down before it is started again (seconds).
DOWNTIME_S = {"scheduler": 1.0, "worker": 0.0, "api": 1.0, "broker": 3.0, "postgres": 1.0}


@dataclass
class Fault:
    round: int
    kind: str
    target: str
    injected_at: float  # epoch seconds
    detail: str = ""
    back_s: float | None = None  # until the killed component served again
    partitions_s: float | None = None  # until every loaded partition was processed again
    apis_s: float | None = None  # until every API instance answered 200 again

    @property
    def recovery_s(self) -> float | None:
        if self.partitions_s is None or self.apis_s is None:
            return None
        return max(self.partitions_s, self.apis_s)


def plan(rounds: int, kinds: tuple[str, ...], rng: random.Random) -> list[str]:
    """Random order, but balanced: every kind once per cycle of len(kinds) rounds."""
    out: list[str] = []
    while len(out) < rounds:
        cycle = list(kinds)
        rng.shuffle(cycle)
        out += cycle
    return out[:rounds]


def available_kinds(rig: Rig, *, freezes_too: bool = True) -> tuple[str, ...]:
    kinds = ["scheduler", "worker", "api"]
    if rig.services.kafka is not None and rig.services.kafka.n_brokers >= 3:
        kinds.append("broker")  # one broker of a single-broker cluster is an outage
    if rig.services.postgres is not None:
        kinds.append("postgres")
    if freezes_too:
        kinds += [f"freeze-{k}" for k in kinds]
    for cut in CUTS:
        if _isolated(rig, cut):
            kinds.append(cut)
    return tuple(kinds)


def _isolated(rig: Rig, kind: str) -> list[str]:
    """The processes a ``cut-*`` fault of ``kind`` may cut off."""
    names = rig.schedulers if kind == "cut-scheduler" else rig.apis
    return [n for n in names if n in rig.nets]


def inject(rig: Rig, kind: str, rnd: int, rng: random.Random) -> Fault:
    """Kill, wait the kind's downtime, start again (or freeze and thaw). Returns once
    restarted (thawed)."""
    if kind in freezes.FREEZE_KINDS:
        return _freeze(rig, kind, rnd, rng)
    if kind in CUTS:
        return _cut(rig, kind, rnd, rng)
    down = DOWNTIME_S[kind]
    if kind == "scheduler":
        return _scheduler(rig, rnd, rng, down)
    if kind == "worker":
        return _worker(rig, rnd, rng)
    if kind == "api":
        return _api(rig, rnd, rng, down)
    if kind == "broker":
        return _broker(rig, rnd, rng, down)
    if kind == "postgres":
        return _postgres(rig, rnd, rng, down)
    raise ValueError(f"unknown fault kind {kind!r}")


def _freeze(rig: Rig, kind: str, rnd: int, rng: random.Random) -> Fault:
    seconds = freezes.pause_s(rng)
    got = freezes.target(rig, kind, rng)
    if got is None:
        return Fault(rnd, kind, "-", time.time(), "nothing to freeze")
    name, pids, group = got
    f = Fault(rnd, kind, name, time.time(), f"SIGSTOP {seconds:g} s, pids {pids}")
    freezes.freeze(pids, seconds, group=group)
    return f


def _cut(rig: Rig, kind: str, rnd: int, rng: random.Random) -> Fault:
    name = rng.choice(_isolated(rig, kind))
    net = rig.nets[name]
    services = rng.choice((("kafka",), ("postgres",), ("kafka", "postgres")))
    f = Fault(rnd, kind, name, time.time(), f"cut from {'+'.join(services)} {CUT_S:g} s")
    for service in services:
        net.cut(service)
    try:
        time.sleep(CUT_S)
    finally:
        for service in services:
            net.heal(service)
    return f


def _scheduler(rig: Rig, rnd: int, rng: random.Random, down: float) -> Fault:
    name = rng.choice(rig.schedulers)
    pid, workers = rig.pid(name), rig.workers(name)
    f = Fault(rnd, "scheduler", name, time.time(), f"pid {pid}, workers {workers}")
    sigkill(pid)  # the process only, as a crash would: its workers must notice by themselves
    rig.forget(name)
    if not wait_gone(workers, 10):
        f.detail += "; ORPHANED WORKERS killed"
        for w in workers:
            sigkill(w)
    time.sleep(down)
    rig.start_scheduler(name)
    return f


def _worker(rig: Rig, rnd: int, rng: random.Random) -> Fault:
    name = rng.choice(rig.schedulers)
    workers = [w for w in rig.workers(name) if alive(w)]
    if not workers:
        return Fault(rnd, "worker", name, time.time(), "no live worker to kill")
    victim = rng.choice(workers)
    f = Fault(rnd, "worker", f"{name}/{victim}", time.time())
    sigkill(victim)
    wait_gone([victim], 5)  # its scheduler reaps it; then it no longer counts as live
    return f


def _api(rig: Rig, rnd: int, rng: random.Random, down: float) -> Fault:
    name = rng.choice(rig.apis)
    pid = rig.pid(name)
    f = Fault(rnd, "api", name, time.time(), f"pid {pid}")
    os.killpg(pid, signal.SIGKILL)  # uvicorn leads its own process group
    rig.forget(name)
    time.sleep(down)
    rig.start_api(name)
    return f


def _broker(rig: Rig, rnd: int, rng: random.Random, down: float) -> Fault:
    kafka = rig.services.kafka
    assert kafka is not None
    i = rng.randrange(kafka.n_brokers)
    f = Fault(rnd, "broker", f"broker-{i}", time.time())
    kafka.kill(i)
    time.sleep(down)
    kafka.restart(i)
    return f


def _postgres(rig: Rig, rnd: int, rng: random.Random, down: float) -> Fault:
    pg = rig.services.postgres
    assert pg is not None
    mode = rng.choice(("restart", "crash"))
    f = Fault(rnd, "postgres", "postgres", time.time(), mode)
    if mode == "crash":
        pg.kill()
    else:
        pg.stop()
    time.sleep(down)
    pg.start()
    return f
