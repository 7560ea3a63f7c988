"""`gristmill api --workers N` with GRISTMILL_API_OWN_SOCKETS (decision 73): each process
accepts on a socket of its own,
so a keep-alive client's connections spread over all of them; one that dies is replaced
on its socket while the others answer; SIGTERM stops them all."""

from __future__ import annotations

import collections
import os
import signal
import socket
import time

import httpx
import psutil
import pytest

from gristmill.devservices.stack import System

PROCESSES = 3
OWN_SOCKETS = {"GRISTMILL_API_OWN_SOCKETS": "true"}  # off by default until measured
CONNECTIONS = 60


def _children(parent: int) -> list[psutil.Process]:
    """The API's processes (uvicorn servers), not multiprocessing's helpers."""
    kids = psutil.Process(parent).children()
    return [k for k in kids if "resource_tracker" not in " ".join(k.cmdline())]


def _owners(port: int, pids: set[int]) -> collections.Counter[int]:
    """Established connections to ``port`` by the API process that holds them."""
    got: collections.Counter[int] = collections.Counter()
    for c in psutil.net_connections(kind="tcp"):
        ours = c.laddr and c.laddr.port == port and c.pid in pids
        if ours and c.status == psutil.CONN_ESTABLISHED:
            got[c.pid] += 1
    return got


def _open(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: api\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200"), "healthz over a kept connection"
        socks.append(s)
    return socks


def _serving(parent: int, n: int, timeout_s: float = 60) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        kids = _children(parent)
        if len(kids) == n:
            return kids
        time.sleep(0.2)
    raise AssertionError(f"{len(_children(parent))} API processes, expected {n}")


@pytest.mark.skipif(not hasattr(socket, "SO_REUSEPORT"), reason="needs SO_REUSEPORT")
def test_connections_spread_over_the_processes_and_a_dead_one_is_replaced(
    system: System,
) -> None:
    url = system.start_api("api-spread", processes=PROCESSES, cli=True, env=OWN_SOCKETS)
    port = int(url.rsplit(":", 1)[1])
    parent = system.procs["api-spread"].pid
    try:
        kids = _serving(parent, PROCESSES)
        pids = {k.pid for k in kids}
        held = _open(port, CONNECTIONS)
        try:
            by_process = _owners(port, pids)
            assert sum(by_process.values()) == CONNECTIONS, by_process
            # Every process took a part; none near all (the kernel hashes each
            # connection to a socket: about a third each, give or take its noise).
            assert len(by_process) == PROCESSES, by_process
            assert max(by_process.values()) <= CONNECTIONS * 0.6, by_process
        finally:
            for s in held:
                s.close()

        # One process killed: the others answer meanwhile, and it is replaced.
        victim = kids[0].pid
        os.kill(victim, signal.SIGKILL)
        for _ in range(20):
            assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = {k.pid for k in _children(parent)}
            if len(now) == PROCESSES and victim not in now:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"not replaced: {_children(parent)}")
        held = _open(port, CONNECTIONS)
        try:
            assert len(_owners(port, {k.pid for k in _children(parent)})) == PROCESSES
        finally:
            for s in held:
                s.close()
    finally:
        code = system.stop("api-spread")
    assert code == 0, code
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in kids[1:])


def test_a_second_api_on_a_port_in_use_is_refused(system: System) -> None:
    url = system.start_api("api-first", processes=2, cli=True, env=OWN_SOCKETS)
    port = int(url.rsplit(":", 1)[1])
    try:
        from gristmill.api_processes import address_in_use

        # SO_REUSEPORT would let a second server share the port quietly: checked first.
        assert address_in_use("127.0.0.1", port)
    finally:
        system.stop("api-first")
