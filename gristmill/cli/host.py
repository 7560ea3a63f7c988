"""``gristmill host``: every Gristmill process one GPU host needs, shaped and supervised.

The shape (gristmill/hostshape.py) says how many API processes, schedulers and workers;
this module starts them and keeps them running the way an orchestrator would:

* one ``gristmill api --workers N`` (N uvicorn processes on one port, their metrics
  summed at /metrics);
* S ``gristmill scheduler --workers 0``, each with its own worker socket;
* per GPU one ``gristmill worker`` pinned to it (``CUDA_VISIBLE_DEVICES``) that serves
  every scheduler of the host (decision 14) and dials a restarted one again.

A process that exits while the host runs is started again after a backoff (and the log
says so); the rest keep serving. SIGTERM or Ctrl-C stops the API first (no new
requests), then the schedulers (they drain and commit), then the workers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gristmill.hostshape import HostCosts, HostShape, shape_host
from gristmill.restarts import RestartPolicy

log = logging.getLogger(__name__)

# A process that keeps dying young waits 1, 2, 4, 8, then 10 s between starts (a GPU
# host's processes are few and each is needed: the pause stays short).
RESTART_MAX_DELAY_S = 10.0
STOP_GRACE_S = 30.0


def host_cores() -> int:
    """Cores this process may run on (a container's cpuset, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def host_gpus() -> list[str]:
    """The GPUs to use: ``CUDA_VISIBLE_DEVICES`` when set, else what NVML counts."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML library or no driver: a CPU host
        return []


def load_costs(path: Path | None) -> HostCosts:
    if path is None:
        return HostCosts()
    data = json.loads(path.read_text())
    return HostCosts.from_dict(data.get("costs", data))


@dataclass
class Child:
    """One supervised process: how to start it and its restart history."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0

    def start(self) -> None:
        out = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        out.close()
        self.started_at = time.monotonic()

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)


@dataclass
class Supervisor:
    """Starts the children in order, restarts any that exits, stops them in order."""

    groups: list[list[Child]]  # start order; stop order is the reverse
    stopping: threading.Event = field(default_factory=threading.Event)
    policy: RestartPolicy = field(
        default_factory=lambda: RestartPolicy(max_delay_s=RESTART_MAX_DELAY_S)
    )

    @property
    def children(self) -> list[Child]:
        return [c for g in self.groups for c in g]

    def watch(self, poll_s: float = 0.5) -> None:
        """Until ``stopping``: restart what exits, with a growing backoff."""
        due: dict[str, float] = {}
        for child in self.children:
            self.policy.started(child.name, child.started_at)
        while not self.stopping.wait(poll_s):
            now = time.monotonic()
            for child in self.children:
                if child.proc is None or child.proc.poll() is None:
                    continue
                if child.name not in due:
                    due[child.name] = self.policy.died(child.name, now)
                    log.warning(
                        "%s exited with %s after %.0f s; starting it again in %.0f s",
                        child.name,
                        child.proc.returncode,
                        now - child.started_at,
                        due[child.name] - now,
                    )
                if now >= due[child.name]:
                    del due[child.name]
                    child.start()
                    self.policy.started(child.name, child.started_at)
                    log.warning("restarted %s (pid %s)", child.name, child.proc.pid)

    def stop(self) -> None:
        self.stopping.set()
        for group in reversed(self.groups):
            for child in group:
                child.signal(signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            for child in group:
                if child.proc is None:
                    continue
                try:
                    child.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    child.signal(signal.SIGKILL)
                    child.proc.wait()


def host_children(
    shape: HostShape,
    gpus: Sequence[str],
    *,
    models: str,
    run_dir: Path,
    env: dict[str, str],
    api_port: int | None = None,
    grpc_port: int | None = None,
) -> list[list[Child]]:
    """The processes of ``shape``, grouped in start order: schedulers, workers, API."""
    py = sys.executable
    metrics_port = int(env.get("GRISTMILL_METRICS_PORT", "9464") or 0)
    run_dir.mkdir(parents=True, exist_ok=True)
    logs = run_dir / "logs"
    logs.mkdir(exist_ok=True)
    schedulers, sockets = [], []
    for i in range(shape.schedulers):
        sock_dir = run_dir / f"s{i}"
        sockets.append(str(sock_dir / "workers.sock"))
        argv = [py, "-m", "gristmill", "scheduler", "--workers", "0", "--models", models]
        argv += ["--socket-dir", str(sock_dir)]
        # Each scheduler its own metrics port: the next ports after the configured one.
        senv = {**env, "GRISTMILL_METRICS_PORT": str(metrics_port + i)} if metrics_port else env
        schedulers.append(Child(f"scheduler-{i}", argv, senv, logs / f"scheduler-{i}.log"))
    workers = []
    # Each GPU's workers in turn (shape.workers is a multiple of the GPUs when it has any).
    per_gpu = shape.workers // len(gpus) if gpus else 1
    devices = [d for d in gpus for _ in range(per_gpu)] or ["" for _ in range(shape.workers)]
    for i, device in enumerate(devices[: shape.workers]):
        argv = [py, "-m", "gristmill", "worker", "--models", models, "--redial"]
        wid = f"gpu{device}-{i % per_gpu}" if device and per_gpu > 1 else f"gpu{device or i}"
        argv += ["--worker-id", wid]
        for s in sockets:
            argv += ["--socket", s]
        wenv = {**env, "CUDA_VISIBLE_DEVICES": device} if device else dict(env)
        workers.append(Child(f"worker-{wid[3:]}", argv, wenv, logs / f"worker-{i}.log"))
    if not shape.api_processes:  # a GPU node behind an API tier of its own
        return [schedulers, workers, []]
    api_argv = [py, "-m", "gristmill", "api", "--workers", str(shape.api_processes)]
    if api_port is not None:
        api_argv += ["--port", str(api_port)]
    if grpc_port is not None:  # else GRISTMILL_GRPC_PORT, from the environment
        api_argv += ["--grpc-port", str(grpc_port)]
    api = [Child("api", api_argv, env, logs / "api.log")]
    return [schedulers, workers, api]


def wait_for_sockets(paths: Sequence[str], timeout_s: float = 60.0) -> None:
    """Workers dial the schedulers' sockets: wait until each scheduler listens."""
    deadline = time.monotonic() + timeout_s
    while not all(Path(p).exists() for p in paths):
        if time.monotonic() > deadline:
            missing = [p for p in paths if not Path(p).exists()]
            raise RuntimeError(f"schedulers did not open their sockets: {missing}")
        time.sleep(0.2)


def run_host(
    *,
    models: str,
    run_dir: Path,
    api_processes: int | None,
    schedulers: int | None,
    colocated: bool,
    reserve_cores: float,
    costs: HostCosts,
    api_port: int | None,
    plan_only: bool,
    grpc_port: int | None = None,
    workers_per_gpu: int = 1,
) -> int:
    gpus = host_gpus()
    shape = shape_host(
        host_cores(),
        len(gpus),
        costs,
        colocated=colocated,
        reserve_cores=reserve_cores,
        api_processes=api_processes,
        schedulers=schedulers,
        workers_per_gpu=workers_per_gpu,
    )
    print(describe(shape, gpus), flush=True)
    if plan_only:
        return 0
    env = dict(os.environ)
    groups = host_children(
        shape, gpus, models=models, run_dir=run_dir, env=env, api_port=api_port, grpc_port=grpc_port
    )
    sup = Supervisor(groups)

    def on_signal(signum: int, _frame: object) -> None:
        sup.stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    schedulers_group, workers_group, api_group = groups
    for child in schedulers_group:
        child.start()
    wait_for_sockets([str(run_dir / f"s{i}" / "workers.sock") for i in range(shape.schedulers)])
    for child in (*workers_group, *api_group):
        child.start()
    print(f"host running: pids in {run_dir / 'logs'}", flush=True)
    try:
        sup.watch()
    finally:
        sup.stop()
    return 0


def describe(shape: HostShape, gpus: Sequence[str]) -> str:
    lines = [
        f"host shape: {shape.api_processes} API process(es), {shape.schedulers} scheduler(s), "
        f"{shape.workers} worker(s) on GPU(s) {','.join(gpus) or 'none'}; "
        f"about {shape.sync_capacity_rps:,.0f} sync req/s of API and scheduler CPU",
    ]
    lines += [f"  - {r}" for r in shape.reasons]
    return "\n".join(lines)
