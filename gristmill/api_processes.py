"""`gristmill api --workers N`: N uvicorn processes, each accepting on a socket of its own.

uvicorn's own multi-process mode has every process accept from one shared socket: the
kernel wakes them all for a new connection and whichever runs first takes it, so an idle
process that keeps winning gathers a keep-alive client's connections, and with them
that share of its traffic for as long as they last. Measured with 8 processes and 400
connections opened at once (``bench/accept_spread.py``): the busiest process took 1.8 to
2.6 times an even share; on a GPU host at 10,000 req/s the busiest API process ran at
0.81-0.84 of a core while the mean was 0.70 (docs/bench/gpu-host.md r14).

Here each process listens on a socket of its own, all bound to the same address with
``SO_REUSEPORT``: the kernel hashes each new connection to one of them (1.2 times an
even share in the same measurement). The parent binds the sockets and keeps them open
for the life of the server, so a process that dies is replaced on the same socket and
the connections that arrived meanwhile wait in its backlog instead of being refused.
The parent restarts a process that exits (after a pause if it keeps dying at once),
stops them all on SIGTERM or SIGINT (each finishes its requests: uvicorn's graceful
shutdown), and exits when one fails to start at all (a broken app or settings would
fail every restart the same way).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from gristmill.devservices.ports import port_free

log = logging.getLogger(__name__)

# A process that exits sooner than this after its start is restarted after a pause
# that doubles each time (up to the cap), not at once in a loop.
QUICK_EXIT_S = 5.0
RESTART_PAUSE_MAX_S = 10.0


def address_in_use(host: str, port: int) -> bool:
    """True if another server listens on host:port. Checked before binding with
    SO_REUSEPORT, which would otherwise quietly share the port with a server of the
    same user instead of failing as a plain bind does."""
    return not port_free(port, host)


def reuseport_sockets(host: str, port: int, n: int, backlog: int) -> list[socket.socket]:
    """``n`` listening sockets on one address; port 0: the first picks one, the rest
    join it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    socks: list[socket.socket] = []
    for _ in range(n):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.set_inheritable(True)
        port = sock.getsockname()[1]
        socks.append(sock)
    return socks


def _serve(config: uvicorn.Config, sock: socket.socket) -> None:
    """A child: one uvicorn server on its own socket."""
    # The parent stops us with SIGTERM; a ^C at a terminal reaches us too.
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.Server(config).run(sockets=[sock])


@dataclass
class _Slot:
    """One socket and the process serving it (replaced when it exits)."""

    sock: socket.socket
    process: BaseProcess | None = None
    started_at: float = 0.0
    pause_s: float = 0.0
    restart_at: float = 0.0


class ApiProcesses:
    """The parent of N API processes, one socket each."""

    def __init__(self, config: uvicorn.Config, processes: int) -> None:
        if address_in_use(config.host, config.port):
            raise OSError(f"{config.host}:{config.port} is already in use")
        self.config = config
        self.slots = [
            _Slot(sock)
            for sock in reuseport_sockets(config.host, config.port, processes, config.backlog)
        ]
        self.stop = threading.Event()
        self.failed = False
        self._ctx = mp.get_context("spawn")

    def _start(self, slot: _Slot, now: float) -> None:
        slot.process = self._ctx.Process(target=_serve, args=(self.config, slot.sock))
        slot.process.start()
        slot.started_at = now

    def _tend(self, now: float) -> None:
        """Restart what exited; give up when a process cannot start at all."""
        for slot in self.slots:
            p = slot.process
            if p is not None and p.is_alive():
                continue
            if p is not None:
                p.join()
                if p.exitcode == STARTUP_FAILURE:
                    log.error("API process %s failed to start; stopping", p.pid)
                    self.failed = True
                    self.stop.set()
                    return
                quick = now - slot.started_at < QUICK_EXIT_S
                slot.pause_s = min(RESTART_PAUSE_MAX_S, max(0.5, slot.pause_s * 2)) if quick else 0
                slot.restart_at = now + slot.pause_s
                slot.process = None
                log.warning(
                    "API process %s exited (code %s); restarting in %.1f s",
                    p.pid,
                    p.exitcode,
                    slot.pause_s,
                )
            if now >= slot.restart_at:
                self._start(slot, now)

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop.set())
        now = time.monotonic()
        for slot in self.slots:
            self._start(slot, now)
        while not self.stop.wait(0.5):
            self._tend(time.monotonic())
        self._stop_all()
        return 1 if self.failed else 0

    def _stop_all(self) -> None:
        live = [s.process for s in self.slots if s.process is not None and s.process.is_alive()]
        for p in live:
            p.terminate()  # SIGTERM: uvicorn shuts down gracefully
        for p in live:
            p.join()
        for slot in self.slots:
            slot.sock.close()


def serve(config: uvicorn.Config, processes: int, *, own_sockets: bool = True) -> int:
    """Run the API as ``processes`` processes; returns the exit status. ``own_sockets``:
    a socket each (Linux only: elsewhere SO_REUSEPORT does not spread connections, the
    last socket bound takes them all), else uvicorn's one shared socket. One process
    runs in this one, as ``uvicorn.run`` does."""
    if processes <= 1:
        uvicorn.Server(config).run()
        return 0
    if own_sockets and sys.platform == "linux":
        return ApiProcesses(config, processes).run()
    from uvicorn.supervisors import Multiprocess

    config.workers = processes
    Multiprocess(config, sockets=[config.bind_socket()]).run()
    return 0
