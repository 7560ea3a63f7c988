"""``gristmill host`` (decision 51) on this machine's CPU: the processes its shape names
serve the model it was given, and one that dies is started again while the rest keep
serving; the worker joins a restarted scheduler again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from core.models.sim import sim_output
from gristmill.devservices import free_port
from gristmill.devservices.stack import REPO, Services, System, build_system


@pytest.fixture(scope="module")
def host(
    services: Services, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[System, subprocess.Popen[bytes], Path]]:
    workdir: Path = tmp_path_factory.mktemp("host")
    system = build_system(services, workdir, sim_batch_ms=20)
    port = free_port()
    run_dir = workdir / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gristmill", "host", "--models", "sim", "--api-processes", "1",
         "--schedulers", "2", "--port", str(port), "--run-dir", str(run_dir)],
        env={**system.env, "GRISTMILL_METRICS_PORT": str(free_port())},
        cwd=REPO,
        stdout=(workdir / "host.log").open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    system.url = f"http://127.0.0.1:{port}"
    try:
        system.wait_until_serving("sim", timeout_s=180)
        yield system, proc, workdir
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _of(proc: subprocess.Popen[bytes], command: str) -> list[psutil.Process]:
    """The live children running ``gristmill <command>`` (a killed one not yet reaped by
    the host is a zombie, and no longer one of them)."""
    out = []
    for c in psutil.Process(proc.pid).children():
        try:
            if f"gristmill {command}" in " ".join(c.cmdline()):
                out.append(c)
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            continue
    return out


def _all_answered(system: System, n: int, tag: str) -> None:
    with httpx.Client(timeout=30) as client:
        for i in range(n):
            text = f"{tag} {i}"
            r = client.post(
                f"{system.url}/v1/infer",
                headers=system.headers(),
                json={"model": "sim", "input": text},
            )
            assert r.status_code == 200, r.text
            assert r.json()["output"] == sim_output(text)


def test_the_shape_it_prints_is_what_runs_and_it_serves_the_model(
    host: tuple[System, subprocess.Popen[bytes], Path],
) -> None:
    system, proc, workdir = host
    log = (workdir / "host.log").read_text()
    assert "1 API process(es), as asked" in log and "2 scheduler(s), as asked" in log
    assert len(_of(proc, "scheduler")) == 2
    assert len(_of(proc, "worker")) >= 1 and len(_of(proc, "api")) == 1
    _all_answered(system, 40, "shaped")


def test_a_killed_scheduler_is_started_again_and_the_worker_joins_it(
    host: tuple[System, subprocess.Popen[bytes], Path],
) -> None:
    system, proc, workdir = host
    victim = _of(proc, "scheduler")[0]
    victim.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        live = [p for p in _of(proc, "scheduler") if p.pid != victim.pid]
        if len(live) == 2:
            break
        time.sleep(0.5)
    assert len(live) == 2, "the scheduler was not started again"
    assert "restarted scheduler-" in (workdir / "host.log").read_text()
    # Every partition is served again: the restarted scheduler has its worker back.
    time.sleep(8)  # the group rebalances (session timeout 6 s)
    _all_answered(system, 120, "after the kill")
    worker_log = "".join(p.read_text() for p in (workdir / "run" / "logs").glob("worker-*.log"))
    assert "joined the scheduler at" in worker_log
