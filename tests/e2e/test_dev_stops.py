"""``gristmill dev`` stopped in every rude way leaves nothing behind, and starts again.

Every run uses its own free API port and state directory, so these tests can run beside
a developer's own ``make dev`` on port 8000.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import psutil
import pytest

from gristmill.cli.dev import APPS_GRACE_S, SERVICES_GRACE_S
from gristmill.devservices import free_port
from gristmill.devservices.lifeline import KILL_WAIT_S
from tests.e2e.devrun import Dev

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# The bar: after a kill -9 nothing of the tree runs 10 s later.
LEFTOVER_LIMIT_S = 10.0


class Load:
    """A job of 20,000 items (a backlog for the scheduler to drain) plus sync requests
    from 8 threads, until stopped."""

    def __init__(self, dev: Dev) -> None:
        env = dev.env()
        self.url, self.headers = (
            env["GRISTMILL_URL"],
            {"Authorization": f"Bearer {env['GRISTMILL_API_KEY']}"},
        )
        items = [{"input": f"item {i}"} for i in range(20_000)]
        r = httpx.post(
            f"{self.url}/v1/jobs",
            json={"model": "sim", "items": items},
            headers=self.headers,
            timeout=120,
        )
        assert r.status_code == 202, r.text
        self.stop = threading.Event()
        self.answered = 0
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(8)]
        for t in self.threads:
            t.start()
        deadline = time.monotonic() + 60
        while self.answered < 20:
            assert time.monotonic() < deadline, "no sync answers under load"
            time.sleep(0.1)
        # The system is busy now: the scheduler holds a backlog of job items.

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self.stop.is_set():
                try:
                    r = client.post(
                        f"{self.url}/v1/infer",
                        json={"model": "sim", "input": "load"},
                        headers=self.headers,
                    )
                    self.answered += r.status_code == 200
                except httpx.HTTPError:
                    time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(15)


def _tail(dev: Dev, name: str) -> str:
    path = dev.state / "logs" / name
    return f"\n--- {name}:\n" + (path.read_text()[-3000:] if path.exists() else "(none)")


@pytest.fixture
def workdir() -> Iterator[Path]:
    # PostgreSQL runs as an unprivileged user when we are root: it must traverse this.
    path = Path(tempfile.mkdtemp(prefix="gm-devstop-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def runs() -> Iterator[list[Dev]]:
    started: list[Dev] = []
    try:
        yield started
    finally:
        for dev in started:
            dev.cleanup()


def _start(
    runs: list[Dev],
    workdir: Path,
    port: int,
    *,
    via_make: bool = False,
    env: dict[str, str] | None = None,
) -> Dev:
    dev = Dev(workdir / "state", port, via_make=via_make, env=env)
    runs.append(dev)
    dev.wait_ready()
    return dev


def _assert_clean(dev: Dev, what: str) -> float:
    """Seconds until nothing of ``dev`` ran and no port of it listened (printed: the
    numbers decision 28 quotes come from ``pytest -rP`` of this file)."""
    started = time.monotonic()
    left = dev.tree.leftovers_after(LEFTOVER_LIMIT_S)
    took = time.monotonic() - started
    assert not left, f"{what}: still running {LEFTOVER_LIMIT_S:.0f} s later: {left}"
    print(f"{what}: nothing left after {took:.1f} s")
    return took


def test_kill9_idle_leaves_nothing_and_the_next_start_succeeds(
    workdir: Path, runs: list[Dev]
) -> None:
    port = free_port()
    first = _start(runs, workdir, port)
    assert len(first.tree.procs) >= 8  # Kafka, postmaster and backends, API, scheduler ...
    os.kill(first.dev_pid, signal.SIGKILL)
    _assert_clean(first, "kill -9 of an idle gristmill dev")
    assert "stopped what it started" in first.text()

    second = _start(runs, workdir, port)  # same port, same state directory
    httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).raise_for_status()
    started = time.monotonic()
    os.kill(second.dev_pid, signal.SIGINT)
    assert second.wait_exit(60) == 0
    took = time.monotonic() - started
    # Its watchdog included: when gristmill dev has exited, so has everything it started.
    assert not second.tree.running() and not second.tree.held_ports()
    assert "stopped in" in second.text()  # an orderly stop, not the watchdog's
    assert "stopped what it started" not in second.text()
    assert took < 45, f"an idle stop took {took:.0f} s"


def test_kill9_under_load_leaves_nothing(workdir: Path, runs: list[Dev]) -> None:
    dev = _start(runs, workdir, free_port())
    load = Load(dev)
    dev.snapshot()  # uvicorn and the workers are all up by now
    try:
        os.kill(dev.dev_pid, signal.SIGKILL)
        _assert_clean(dev, "kill -9 of a busy gristmill dev")
    finally:
        load.close()


def test_make_dev_group_sigterm_then_sigkill_under_load(workdir: Path, runs: list[Dev]) -> None:
    """A supervisor's stop: SIGTERM to the process group of ``make dev`` (make forwards
    it, so gristmill dev gets it twice), SIGKILL 5 s later while the scheduler drains."""
    dev = _start(runs, workdir, free_port(), via_make=True)
    load = Load(dev)
    dev.snapshot()
    try:
        os.killpg(dev.proc.pid, signal.SIGTERM)
        time.sleep(5)
        os.killpg(dev.proc.pid, signal.SIGKILL)
        _assert_clean(dev, "SIGTERM then SIGKILL to make dev's group")
    finally:
        load.close()

    again = _start(runs, workdir, dev.port, via_make=True)
    os.killpg(again.proc.pid, signal.SIGTERM)  # twice over, through make: one stop
    assert again.wait_exit(60) is not None
    _assert_clean(again, "SIGTERM to make dev's group")
    assert "stopped in" in again.text()


@pytest.mark.parametrize("batch_ms", [100, 2000], ids=["sim", "slow-model"])
def test_an_orderly_stop_under_load_is_bounded(
    workdir: Path, runs: list[Dev], batch_ms: int
) -> None:
    """One Ctrl-C while the scheduler holds a backlog: it drains (at most SHUTDOWN_DRAIN_S),
    finishes its batches, persists and commits before its grace runs out. The slow model
    (2 s a batch of 100) holds more than the drain's 10 s of work, so the drain runs out
    and the batches on the worker, the one running and the one queued, come after it."""
    env = {"GRISTMILL_SIM_BATCH_MS": str(batch_ms)}
    if batch_ms > 500:  # deadlines a 2 s batch can meet (admission refuses the rest)
        env["GRISTMILL_TIER_SLO_MS"] = '{"enterprise": 10000, "paid": 20000, "free": 30000}'
    dev = _start(runs, workdir, free_port(), env=env)
    load = Load(dev)
    dev.snapshot()
    try:
        started = time.monotonic()
        os.kill(dev.dev_pid, signal.SIGINT)
        rc = dev.wait_exit(APPS_GRACE_S + SERVICES_GRACE_S + 2 * KILL_WAIT_S + 15)
        took = time.monotonic() - started
    finally:
        load.close()
    assert rc == 0, dev.text()[-3000:]
    assert not dev.tree.running() and not dev.tree.held_ports()
    text = dev.text()
    stopped = re.search(r"API(?:, scheduler and ledger| and scheduler) stopped in ([\d.]+) s", text)
    assert stopped, text[-3000:]
    apps_s = float(stopped.group(1))
    # The scheduler finished its own stop (drain, last batch, persist, commit) before
    # the grace ran out, rather than being killed.
    log = (dev.state / "logs" / "scheduler.log").read_text()
    assert "scheduler stopped:" in log
    assert "SIGKILL, still running" not in text, text[-3000:] + _tail(dev, "ledger.log")
    assert apps_s < APPS_GRACE_S, f"the scheduler needed its SIGKILL ({apps_s:.1f} s)"
    scheduler_s = _logged_at(log, "scheduler stopped:") - _logged_at(log, "scheduler stopping")
    print(
        f"orderly stop under load: the scheduler's own stop {scheduler_s:.1f} s, "
        f"API and scheduler {apps_s:.1f} s, all {took:.1f} s"
    )


def _logged_at(log: str, text: str) -> float:
    """When the last line containing ``text`` was logged (epoch s; logging's asctime)."""
    line = [line for line in log.splitlines() if text in line][-1]
    stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


def test_second_ctrl_c_stops_a_busy_system_at_once(workdir: Path, runs: list[Dev]) -> None:
    dev = _start(runs, workdir, free_port())
    load = Load(dev)
    dev.snapshot()
    try:
        os.kill(dev.dev_pid, signal.SIGINT)
        time.sleep(1.0)  # draining now
        assert dev.proc.poll() is None
        second = time.monotonic()
        os.kill(dev.dev_pid, signal.SIGINT)
        assert dev.wait_exit(15) is not None, "a second Ctrl-C did not stop it at once"
        took = time.monotonic() - second
    finally:
        load.close()
    assert not dev.tree.running(), f"left after the second Ctrl-C: {dev.tree.running()}"
    _assert_clean(dev, "a second Ctrl-C")
    assert took < 10, f"the second Ctrl-C took {took:.1f} s"
    print(f"a second Ctrl-C: gristmill dev exited {took:.1f} s later")


def test_leftovers_of_a_run_whose_watchdog_died_too(workdir: Path, runs: list[Dev]) -> None:
    port = free_port()
    first = _start(runs, workdir, port)
    busy = Dev(workdir / "state", free_port())  # same state directory while it runs
    runs.append(busy)
    assert busy.wait_exit(60) == 1
    assert f"another gristmill dev (pid {first.dev_pid})" in busy.text()

    watchdogs = [
        p for p in psutil.Process(first.dev_pid).children() if "lifeline" in " ".join(p.cmdline())
    ]
    assert len(watchdogs) == 1
    watchdogs[0].kill()
    os.kill(first.dev_pid, signal.SIGKILL)
    time.sleep(2)
    assert first.tree.running(), "expected leftovers: the watchdog was killed too"

    second = _start(runs, workdir, port)  # finds them, stops them, starts
    text = second.text()
    assert "stopped a leftover of an earlier run" in text
    assert f"API (port {port})" in text and "PostgreSQL" in text
    assert not first.tree.running(), "the next start left the earlier run's processes"


def test_a_taken_port_is_named_with_the_way_out(workdir: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        dev = Dev(workdir / "state", port)
        try:
            rc = dev.wait_exit(60)
        finally:
            dev.cleanup()
    text = dev.text()
    assert rc == 1, text
    assert f"port {port} is already in use by pid {os.getpid()}" in text
    assert "--port" in text and "--port 0" in text
    assert "starting Kafka" not in text  # refused before starting anything
