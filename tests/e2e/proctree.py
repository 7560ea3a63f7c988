"""What a command started, and what of it is still running after a rude stop."""

from __future__ import annotations

import contextlib
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil


@dataclass
class Tree:
    """Processes (pid -> (start time, command)) and listening ports (port -> role)."""

    procs: dict[int, tuple[float, str]] = field(default_factory=dict)
    ports: dict[int, str] = field(default_factory=dict)

    def add(self, proc: psutil.Process, *, with_children: bool = True) -> None:
        try:
            found = [proc, *proc.children(recursive=True)] if with_children else [proc]
        except psutil.Error:
            return
        for p in found:
            with contextlib.suppress(psutil.Error):
                self.procs[p.pid] = (p.create_time(), " ".join(p.cmdline())[:100])

    def add_postmaster(self, data_dir: Path) -> None:
        try:
            pid = int((data_dir / "postmaster.pid").read_text().split()[0])
            self.add(psutil.Process(pid))
        except (OSError, ValueError, IndexError, psutil.Error):
            pass

    def running(self) -> list[str]:
        out = []
        for pid, (created, cmd) in self.procs.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(f"{pid} {cmd}")
            except psutil.Error:
                pass
        return out

    def held_ports(self) -> list[str]:
        return [f"{role} {port}" for port, role in self.ports.items() if listening(port)]

    def leftovers_after(self, seconds: float) -> list[str]:
        """Wait up to ``seconds`` for every process to end and every port to close."""
        deadline = time.monotonic() + seconds
        while True:
            left = self.running() + self.held_ports()
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)

    def kill_all(self) -> None:
        """Test cleanup: only processes this tree recorded (never by name)."""
        for pid, (created, _) in self.procs.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created:
                    p.kill()
            except psutil.Error:
                pass


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def kafka_ports(node_dir: Path) -> list[int]:
    """The broker and controller ports a Kafka node listens on (server.properties)."""
    for line in (node_dir / "server.properties").read_text().splitlines():
        if line.startswith("listeners="):
            return [int(part.rsplit(":", 1)[1]) for part in line.split("=", 1)[1].split(",")]
    return []
