"""One ``gristmill dev`` run by a test: started in its own process group and state
directory, on a port of the test's choosing, as a developer (or ``make dev``) starts it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from gristmill.cli.dev import APPS_GRACE_S, SERVICES_GRACE_S
from tests.e2e.proctree import Tree, kafka_ports

REPO = Path(__file__).resolve().parents[2]
READY_S = 300.0
# The longest an orderly stop of gristmill dev may take (its own bounds, and a margin).
STOP_BOUND_S = APPS_GRACE_S + SERVICES_GRACE_S + 30.0


class Dev:
    """One ``gristmill dev`` (optionally under make, as ``make dev`` runs it)."""

    def __init__(
        self,
        state: Path,
        port: int,
        *,
        via_make: bool = False,
        env: dict[str, str] | None = None,
        workers: int = 1,
        models: str | None = "sim",
    ) -> None:
        """``models`` None: the models `gristmill dev` serves by default."""
        self.state, self.port = state, port
        self.out = state.parent / f"dev-{time.monotonic_ns()}.out"
        cmd = [sys.executable, "-m", "gristmill", "dev", "--state-dir", str(state)]
        cmd += ["--port", str(port), "--workers", str(workers)]
        cmd += ["--models", models] if models else []
        if via_make:
            makefile = state.parent / "Makefile"
            makefile.write_text("dev:\n\t" + " ".join(cmd) + "\n")
            cmd = ["make", "-s", "-f", str(makefile), "dev"]
        extra = env or {}
        env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP", "DATABASE_URL")}
        env["PYTHONPATH"] = str(REPO)
        env.update(extra)
        with self.out.open("wb") as out:
            # Its own process group: the group signals below reach only this run.
            self.proc = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.tree = Tree()

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_S
        while "Gristmill is running" not in self.text():
            assert self.proc.poll() is None, f"gristmill dev exited:\n{self.text()[-3000:]}"
            assert time.monotonic() < deadline, f"not ready:\n{self.text()[-3000:]}"
            time.sleep(0.5)
        self.snapshot()

    @property
    def dev_pid(self) -> int:
        """gristmill dev itself (make's child when run under make)."""
        top = psutil.Process(self.proc.pid)
        for p in [top, *top.children(recursive=True)]:
            if "gristmill" in p.cmdline() and "dev" in p.cmdline():
                return p.pid
        raise AssertionError("no gristmill dev process")

    def pid_of(self, what: str) -> int:
        """The live process gristmill dev started for ``what`` ("api": uvicorn's parent
        process, "scheduler"): a child of gristmill dev itself."""
        marks = {"api": "ingest.main:app", "scheduler": "scheduler"}
        for p in psutil.Process(self.dev_pid).children():
            try:
                if marks[what] in p.cmdline() and p.status() != psutil.STATUS_ZOMBIE:
                    return int(p.pid)
            except psutil.NoSuchProcess:
                continue
        raise AssertionError(f"gristmill dev runs no {what} now")

    def env(self) -> dict[str, str]:
        lines = (self.state / "dev.env").read_text().splitlines()
        return dict(line.removeprefix("export ").split("=", 1) for line in lines if "=" in line)

    def snapshot(self) -> None:
        """Everything this run started: its process tree, the (daemonised) postmaster,
        and every port it listens on."""
        self.tree.add(psutil.Process(self.proc.pid))
        self.tree.add_postmaster(self.state / "services" / "postgres" / "data")
        env = self.env()
        self.tree.ports[self.port] = "API"
        if "GRISTMILL_GRPC_ADDRESS" in env:
            self.tree.ports[int(env["GRISTMILL_GRPC_ADDRESS"].rsplit(":", 1)[1])] = "API (gRPC)"
        self.tree.ports[int(env["DATABASE_URL"].rsplit(":", 1)[1].split("/")[0])] = "PostgreSQL"
        for port in kafka_ports(self.state / "services" / "kafka" / "node-0"):
            self.tree.ports[port] = "Kafka"

    def wait_exit(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def cleanup(self) -> None:
        """Stop it as a developer does (Ctrl-C), SIGKILL only if that overruns its bound.
        A SIGKILL of the whole group at once took the lifeline's watchdog along and left
        the API and the scheduler (each leads its own session) running after the suite."""
        if self.proc.poll() is None:
            try:
                os.kill(self.dev_pid, signal.SIGINT)
                stopped = self.wait_exit(STOP_BOUND_S) is not None
            except (AssertionError, psutil.Error, ProcessLookupError):
                stopped = False  # gristmill dev not (or no longer) there to ask
            if not stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
        self.tree.kill_all()
