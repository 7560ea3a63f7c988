"""The lifeline with real processes (no Kafka, no PostgreSQL): what a command starts
ends when the command is killed, and a later start finds what was left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gristmill.devservices.leftovers import (
    RECORD_FILE,
    StateDirError,
    lock_state_dir,
    read_record,
    stop_leftovers,
)
from gristmill.devservices.lifeline import GRACE_S, Group
from gristmill.devservices.procs import alive, children, group_members, start_time, wait_gone

REPO = Path(__file__).resolve().parents[2]
# A command that starts a process group (a shell and two sleeps, one ignoring SIGTERM
# when asked), holds it, prints the group's id and waits to be killed.
COMMAND = textwrap.dedent(
    """
    import subprocess, sys, time
    from pathlib import Path
    from gristmill.devservices.lifeline import lifeline
    trap = "trap '' TERM; " if sys.argv[1] == "stubborn" else ""
    p = subprocess.Popen(["bash", "-c", trap + "sleep 300 & sleep 300; wait"],
                         start_new_session=True)
    if sys.argv[2] != "-":
        lifeline().record_to(Path(sys.argv[2]))
    lifeline().hold_group(p.pid, "sleepers")
    if sys.argv[1] == "released":
        lifeline().release(lifeline().held()[0])
    print(p.pid, flush=True)
    time.sleep(300)
    """
)


def _command(kind: str, record: Path | None = None) -> tuple[subprocess.Popen[str], int]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", COMMAND, kind, str(record) if record else "-"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    pgid = int(proc.stdout.readline())
    deadline = time.monotonic() + 10
    while len(group_members(pgid)) < 3:  # bash and its two sleeps
        assert time.monotonic() < deadline, "the process group did not start"
        time.sleep(0.05)
    return proc, pgid


def _watchdog(command: int) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for pid in children(command):
            if b"lifeline import main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        time.sleep(0.05)
    raise AssertionError("no watchdog")


def _gone_within(pgid: int, timeout_s: float) -> float | None:
    started = time.monotonic()
    while group_members(pgid):
        if time.monotonic() - started > timeout_s:
            return None
        time.sleep(0.05)
    return time.monotonic() - started


@pytest.mark.parametrize("kind", ["polite", "stubborn"])
def test_sigkill_of_the_command_ends_what_it_started(kind: str) -> None:
    proc, pgid = _command(kind)
    watchdog = _watchdog(proc.pid)
    proc.kill()
    proc.wait()
    took = _gone_within(pgid, 10)
    assert took is not None, f"group {pgid} still runs 10 s after its command was killed"
    if kind == "stubborn":  # ignores SIGTERM: SIGKILL after the grace
        assert took >= GRACE_S - 0.5
    assert wait_gone([watchdog], 5), "the watchdog did not exit after its work"
    assert proc.stderr is not None
    assert "stopped what it started: sleepers" in proc.stderr.read()


def test_a_released_group_is_left_alone() -> None:
    proc, pgid = _command("released")
    watchdog = _watchdog(proc.pid)
    try:
        proc.kill()
        proc.wait()
        assert wait_gone([watchdog], 5)
        assert len(group_members(pgid)) == 3  # its owner stopped holding it: not ours now
    finally:
        os.killpg(pgid, signal.SIGKILL)
        _gone_within(pgid, 5)


def test_next_start_stops_what_a_run_left_when_its_watchdog_died_too(tmp_path: Path) -> None:
    state = tmp_path / "state"
    services = state / "services"
    (services / "kafka").mkdir(parents=True)
    proc, pgid = _command("stubborn", record=state / RECORD_FILE)
    # A process of that run working inside services/ but not recorded (an older run's JVM).
    stray = subprocess.Popen(["sleep", "300"], cwd=services / "kafka", start_new_session=True)
    watchdog = _watchdog(proc.pid)
    os.kill(watchdog, signal.SIGKILL)
    proc.kill()
    proc.wait()
    time.sleep(1)
    assert len(group_members(pgid)) == 3, "left over, as it would be without the watchdog"
    owner, targets = read_record(state / RECORD_FILE)
    assert owner == proc.pid
    assert targets == [Group(pgid, start_time(pgid) or -1, "sleepers")]

    said: list[str] = []
    stop_leftovers(state, services, said.append, grace_s=1.0)
    stray.wait(5)
    assert not group_members(pgid) and not alive(stray.pid)
    assert any(f"(pid {proc.pid}): sleepers" in s for s in said), said
    assert any(f"pid {stray.pid}, still running in {services}" in s for s in said), said
    assert not (state / RECORD_FILE).exists()


def test_a_live_run_keeps_its_state_directory(tmp_path: Path) -> None:
    fd = lock_state_dir(tmp_path)
    try:
        (tmp_path / RECORD_FILE).write_text(
            '{"owner": {"pid": 777}, "targets": [{"kind": "group", "pgid": 1, '
            '"started": 1, "label": "API (port 8000)"}]}'
        )
        with pytest.raises(StateDirError, match=r"pid 777.*API \(port 8000\)"):
            lock_state_dir(tmp_path)
    finally:
        os.close(fd)
    os.close(lock_state_dir(tmp_path))  # free again once the holder is gone
