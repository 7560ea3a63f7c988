"""Process bookkeeping for the benchmark: CPU seconds of a process tree, who listens on a
port, and stopping exactly the processes we started (never by name), also when the
benchmark itself is killed (the lifeline, decision 28)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess

import psutil

from gristmill.devservices.lifeline import Group, lifeline

_held: dict[int, Group | None] = {}  # pid -> its group, held by the lifeline


def hold(proc: subprocess.Popen[bytes] | subprocess.Popen[str], label: str) -> None:
    """``proc`` leads its own session: its whole group ends when the benchmark ends,
    however it ends (``stop_tree`` releases it after an orderly stop)."""
    _held[proc.pid] = lifeline().hold_group(proc.pid, label)


def tree(pid: int) -> list[psutil.Process]:
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cpu_seconds(pid: int, recursive: bool = True) -> float:
    """User+system CPU of ``pid`` (and its live descendants), plus children it reaped."""
    total = 0.0
    procs = tree(pid) if recursive else tree(pid)[:1]
    for i, p in enumerate(procs):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            t = p.cpu_times()
            total += t.user + t.system
            if i == 0:  # reaped children (e.g. PostgreSQL backends that exited)
                total += t.children_user + t.children_system
    return total


def thread_cpu(pid: int, recursive: bool = True) -> dict[str, float]:
    """CPU seconds per thread name (digits folded: ``rdk:broker1`` -> ``rdk:broker#``)
    over ``pid`` and its descendants. Shows native threads py-spy cannot see, such as
    librdkafka's own (``rdk:*``) inside the API processes."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for p in tree(pid) if recursive else tree(pid)[:1]:
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{p.pid}/task"):
                with contextlib.suppress(OSError):
                    with open(f"/proc/{p.pid}/task/{tid}/comm") as f:
                        name = re.sub(r"\d+", "#", f.read().strip())
                    with open(f"/proc/{p.pid}/task/{tid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    # utime and stime are fields 14 and 15 of stat; [0] here is field 3.
                    out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def listener_pid(port: int) -> int | None:
    for c in psutil.net_connections(kind="tcp"):
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            return int(c.pid)
    return None


def stop_tree(proc: subprocess.Popen[bytes] | subprocess.Popen[str], grace_s: float = 30) -> None:
    """SIGTERM the process group we started, then SIGKILL stragglers we saw in its tree
    (Ray actors lead their own process groups, so the group alone is not enough)."""
    seen = tree(proc.pid)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    _gone, alive = psutil.wait_procs(seen, timeout=10)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    lifeline().release(_held.pop(proc.pid, None))
