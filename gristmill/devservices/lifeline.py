"""The lifeline: whatever a Gristmill command starts ends when that command ends, however
it ends (decision 28).

A command that starts services (``gristmill dev``, a test session, a benchmark, a chaos
run) starts one small watchdog process and keeps the write end of a pipe to it. Every
service it starts is *held* by the watchdog: a process group (each service leads its own
session, so the group takes its children along: uvicorn's processes, the scheduler's
workers) or a PostgreSQL data directory (pg_ctl daemonises the postmaster and, as root,
runs it as another user, so it is found by its ``postmaster.pid``). When the command
exits in any way, SIGKILL and the OOM killer included, the kernel closes the pipe; the
watchdog reads end-of-file and stops whatever is still held: SIGTERM (SIGQUIT, an
immediate shutdown, for PostgreSQL), then SIGKILL after ``GRACE_S``. An orderly stop
releases each service as it ends, so the watchdog then has nothing left to do.

``main()`` is the watchdog itself (its stdin is the pipe).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType

from gristmill.devservices.procs import (
    children,
    group_members,
    pid_from_file,
    signal_group,
    start_time,
)

# After the command is gone: how long its services get to stop on their own before
# SIGKILL. A single-node Kafka needs about 1-2 s for a controlled shutdown on an idle
# machine; 3 s plus the SIGKILL wait stays inside the 10 s the rude-stop tests allow.
GRACE_S = 3.0
# After SIGKILL a process is gone within milliseconds unless it sleeps uninterruptibly
# (disk I/O); past this we report it instead of waiting on.
KILL_WAIT_S = 5.0
_POLL_S = 0.05
REPO = Path(__file__).resolve().parents[2]  # the watchdog imports this checkout
_WATCHDOG = "import sys; from gristmill.devservices.lifeline import main; sys.exit(main())"


@dataclass(frozen=True)
class Group:
    """A process group led by a process we started in its own session."""

    pgid: int
    started: int  # the leader's start time (procs.start_time): tells a recycled pid apart
    label: str

    @property
    def key(self) -> str:
        return f"group:{self.pgid}:{self.started}"


@dataclass(frozen=True)
class PgData:
    """The PostgreSQL server running on a data directory, whoever started it."""

    data_dir: str
    label: str

    @property
    def key(self) -> str:
        return f"pgdata:{self.data_dir}"


Target = Group | PgData


def to_json(target: Target) -> dict[str, object]:
    kind = "group" if isinstance(target, Group) else "pgdata"
    return {"kind": kind, **asdict(target)}


def from_json(obj: dict[str, object]) -> Target:
    if obj.get("kind") == "group":
        return Group(int(str(obj["pgid"])), int(str(obj["started"])), str(obj["label"]))
    return PgData(str(obj["data_dir"]), str(obj["label"]))


def postmaster(data_dir: str | Path) -> int | None:
    """The live postmaster of ``data_dir`` (from its postmaster.pid), or None."""
    return pid_from_file(Path(data_dir) / "postmaster.pid", ("postgres", "postmaster"))


def members(target: Target) -> list[int]:
    """The live processes of ``target`` now (empty: nothing left to stop)."""
    if isinstance(target, Group):
        leader_start = start_time(target.pgid)
        if leader_start is not None and leader_start != target.started:
            return []  # the pid was recycled: that group is someone else's
        # With the leader gone, the id cannot be recycled while the group has members.
        return group_members(target.pgid)
    pid = postmaster(target.data_dir)
    if pid is None:
        return []
    # Its backends are its children (and share its group where it leads one).
    return sorted({pid, *children(pid), *group_members(pid)})


def _polite(target: Target) -> None:
    if isinstance(target, Group):
        signal_group(target.pgid, signal.SIGTERM)
        return
    pid = postmaster(target.data_dir)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGQUIT)  # immediate shutdown: the backends quit at once


def _kill(target: Target) -> None:
    if isinstance(target, Group):
        if members(target):
            signal_group(target.pgid, signal.SIGKILL)
        return
    pid = postmaster(target.data_dir)
    if pid is not None:
        signal_group(pid, signal.SIGKILL)
        for victim in (pid, *children(pid)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(victim, signal.SIGKILL)


def describe(target: Target, pids: list[int]) -> str:
    return f"{target.label} (pid {', '.join(map(str, pids))})"


def stop(
    targets: Iterable[Target],
    *,
    grace_s: float = GRACE_S,
    kill_wait_s: float = KILL_WAIT_S,
    give_up: Callable[[], bool] = lambda: False,
    on_kill: Callable[[list[str]], None] = lambda _left: None,
) -> tuple[list[str], list[str]]:
    """SIGTERM every target at once, SIGKILL what is left after ``grace_s`` (at once when
    ``give_up()`` turns true; ``on_kill`` hears which, before). Returns (what was running,
    what survived even SIGKILL)."""
    running = [(t, pids) for t in targets if (pids := members(t))]
    for t, _ in running:
        _polite(t)
    deadline = time.monotonic() + grace_s
    left = [t for t, _ in running]
    while left and time.monotonic() < deadline and not give_up():
        time.sleep(_POLL_S)
        left = [t for t in left if members(t)]
    if left:
        on_kill([describe(t, members(t)) for t in left])
    deadline = time.monotonic() + kill_wait_s
    while left and time.monotonic() < deadline:
        for t in left:  # again each round: a dying supervisor may have forked once more
            _kill(t)
        time.sleep(_POLL_S)
        left = [t for t in left if members(t)]
    return (
        [describe(t, pids) for t, pids in running],
        [describe(t, members(t)) for t in left],
    )


class Lifeline:
    """This process's side: holds and releases targets, starts the watchdog on first use.
    Thread-safe. A forked child does not inherit it (it gets its own if it needs one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, Target] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._pipe: int | None = None
        self._record: Path | None = None

    # ------------------------------------------------------------------ holding

    def hold_group(self, pid: int, label: str) -> Group | None:
        """Hold the process group ``pid`` leads (it was started with start_new_session).
        None if it already exited."""
        started = start_time(pid)
        if started is None:
            return None
        target = Group(pid, started, label)
        self._hold(target)
        return target

    def hold_pgdata(self, data_dir: Path, label: str) -> PgData:
        target = PgData(str(Path(data_dir).resolve()), label)
        self._hold(target)
        return target

    def release(self, target: Target | None) -> None:
        """The target stopped (or is stopped by its owner from here on)."""
        if target is None:
            return
        with self._lock:
            if self._held.pop(target.key, None) is not None:
                self._send({"op": "release", **to_json(target)})
                self._write_record()

    def held(self) -> list[Target]:
        with self._lock:
            return list(self._held.values())

    def record_to(self, path: Path | None) -> None:
        """Also keep what is held, with this process's pid, in ``path`` (JSON), so a later
        start finds what a run left behind if even the watchdog could not stop it."""
        with self._lock:
            self._record = path
            self._write_record()

    def stop_all(
        self, *, grace_s: float = GRACE_S, give_up: Callable[[], bool] = lambda: False
    ) -> tuple[list[str], list[str]]:
        """Stop everything still held, here and now (see ``stop``), and release it."""
        targets = self.held()
        result = stop(targets, grace_s=grace_s, give_up=give_up)
        for t in targets:
            if not members(t):
                self.release(t)
        return result

    def close(self, timeout_s: float = GRACE_S + KILL_WAIT_S + 1.0) -> None:
        """Cut the lifeline now and wait for the watchdog to exit (it first stops whatever
        is still held), so that nothing of ours outlives the command's own exit."""
        with self._lock:
            proc = self._proc
            self._reset()
            self._held.clear()
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout_s)

    def kill_now(self) -> None:
        """SIGKILL everything held, without waiting or locking: safe in a signal handler
        (the orderly stops that were waiting on these processes then return)."""
        for target in list(self._held.values()):
            _kill(target)

    # ------------------------------------------------------------------ internals

    def _hold(self, target: Target) -> None:
        with self._lock:
            # Forget targets that ended on their own (killed by a chaos fault, say).
            for key, old in list(self._held.items()):
                if isinstance(old, Group) and not members(old):
                    del self._held[key]
                    self._send({"op": "release", **to_json(old)})
            self._held[target.key] = target
            self._send({"op": "hold", **to_json(target)})
            self._write_record()

    def _send(self, message: dict[str, object]) -> None:
        line = (json.dumps(message) + "\n").encode()
        for _ in range(2):
            self._ensure_watchdog()
            assert self._pipe is not None
            try:
                os.write(self._pipe, line)  # one short line: atomic on a pipe
                return
            except OSError:  # the watchdog died: start another, it learns all that is held
                self._reset()
        raise RuntimeError("cannot reach the lifeline watchdog")

    def _ensure_watchdog(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        self._reset()
        read_end, write_end = os.pipe()  # both close on exec: no other child inherits them
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _WATCHDOG, str(os.getpid())],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                env=env,
                # Its own session: a signal to our process group (Ctrl-C, a supervisor's
                # SIGTERM and SIGKILL) must not take the watchdog down with us.
                start_new_session=True,
            )
        finally:
            os.close(read_end)
        self._pipe = write_end
        for target in self._held.values():  # all of it again after a watchdog restart
            os.write(write_end, (json.dumps({"op": "hold", **to_json(target)}) + "\n").encode())

    def _reset(self) -> None:
        if self._pipe is not None:
            with contextlib.suppress(OSError):
                os.close(self._pipe)
        self._pipe = None
        self._proc = None

    def _after_fork_in_child(self) -> None:
        # The parent's watchdog watches the parent; this child must not keep it alive.
        self._lock = threading.Lock()
        self._reset()  # closes only this child's copy of the pipe's write end
        self._held = {}
        self._record = None

    def _write_record(self) -> None:
        if self._record is None:
            return
        body = {
            "owner": {"pid": os.getpid(), "started": start_time(os.getpid())},
            "targets": [to_json(t) for t in self._held.values()],
        }
        tmp = self._record.with_suffix(".tmp")
        tmp.write_text(json.dumps(body, indent=1) + "\n")
        tmp.replace(self._record)


_LIFELINE: Lifeline | None = None
_LIFELINE_LOCK = threading.Lock()


def lifeline() -> Lifeline:
    """This process's lifeline (its watchdog starts when the first service is held)."""
    global _LIFELINE
    with _LIFELINE_LOCK:
        if _LIFELINE is None:
            _LIFELINE = Lifeline()
            os.register_at_fork(after_in_child=_LIFELINE._after_fork_in_child)
        return _LIFELINE


# ---------------------------------------------------------------------- the watchdog


class _Cut(Exception):
    """SIGTERM to the watchdog: act as if the command were gone."""


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise _Cut


def watch(owner: int, lines: Iterable[bytes]) -> int:
    """Apply hold/release lines until end-of-file, then stop whatever is still held."""
    held: dict[str, Target] = {}
    try:
        for raw in lines:
            try:
                msg = json.loads(raw)
                target = from_json(msg)
            except (ValueError, KeyError, TypeError):
                continue
            if msg.get("op") == "hold":
                held[target.key] = target
            else:
                held.pop(target.key, None)
    except _Cut:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # finish the job once it has begun
    running, survivors = stop(list(held.values()))
    if running:
        print(
            f"gristmill: pid {owner} is gone; stopped what it started: {'; '.join(running)}",
            file=sys.stderr,
            flush=True,
        )
    if survivors:
        print(f"gristmill: still running after SIGKILL: {'; '.join(survivors)}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    owner = int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_term)
    return watch(owner, sys.stdin.buffer)
