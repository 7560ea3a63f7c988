"""Processes from /proc: alive or not, children, process groups, killing and waiting
(local services, chaos runs, the lifeline)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: [0] is the state (field 3)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _all_pids() -> list[int]:
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()]


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc), e.g. a scheduler's worker processes."""
    kids: list[int] = []
    for other in _all_pids():
        fields = _stat(other)
        if fields is not None and int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            kids.append(other)
    return sorted(kids)


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): with the pid it names one process
    for good, so a recycled pid is never mistaken for the one we started."""
    fields = _stat(pid)
    return int(fields[19]) if fields is not None else None  # field 22 of stat


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group ``pgid``."""
    out = []
    for pid in _all_pids():
        fields = _stat(pid)
        if fields is not None and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(pid)
    return sorted(out)


def working_in(directory: Path) -> list[int]:
    """Live processes whose working directory is ``directory`` or below it (a Kafka JVM
    runs in its node folder, every PostgreSQL process in its data directory)."""
    root = str(directory.resolve())
    out = []
    for pid in _all_pids():
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if (cwd == root or cwd.startswith(root + "/")) and alive(pid):
            out.append(pid)
    return sorted(out)


def cmdline(pid: int, limit: int = 120) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    text = " ".join(raw.replace(b"\0", b" ").decode(errors="replace").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def pid_from_file(path: Path, comm_prefixes: tuple[str, ...]) -> int | None:
    """The live process named on the first line of a pid file whose command name starts
    with one of ``comm_prefixes`` (a stale file may name a recycled pid), or None."""
    try:
        pid = int(path.read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None
    if not alive(pid):
        return None
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    return pid if comm.startswith(comm_prefixes) else None


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def sigkill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def wait_gone(pids: list[int], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
