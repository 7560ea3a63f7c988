"""Small TCP port helpers for the throwaway dev/test servers, and for `gristmill api`'s
check that its port is free (gristmill/api_processes.py)."""

from __future__ import annotations

import socket
import time


def free_port(host: str = "127.0.0.1") -> int:
    """Return a port that was free a moment ago (the OS picks it for port 0).

    There is an unavoidable race between closing this socket and the server binding the
    port, but the kernel hands out ephemeral ports round-robin, so reuse is very unlikely.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """True if something accepts TCP connections on host:port right now."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_for_port(host: str, port: int, timeout_s: float) -> None:
    """Block until host:port accepts a TCP connection; raise TimeoutError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        if port_open(host, port, timeout_s=min(0.5, max(timeout_s, 0.05))):
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{host}:{port} did not accept connections within {timeout_s:.1f}s")
        time.sleep(0.1)


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if a server could listen on host:port now (bound as uvicorn binds it, with
    SO_REUSEADDR, so a port in TIME_WAIT counts as free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def port_holder(port: int) -> str:
    """Who listens on ``port``: "pid N (command line)", or why we cannot tell."""
    import psutil

    from gristmill.devservices.procs import cmdline

    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return "a process we may not inspect"
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
            return f"pid {c.pid} ({cmdline(c.pid)})" if c.pid else "another user's process"
    return "a process that is not listening yet"
