"""How evenly new connections spread over an API's processes.

    python -m bench.accept_spread --processes 8 --connections 400 --waves 3

`gristmill api --workers N` runs uvicorn's N processes on one listening socket: each
process's event loop waits on it, the kernel wakes them all for a new connection and
whichever runs first accepts it. A keep-alive client holds its connections, so the
process that won many of them carries that share of the traffic for as long as they
last. This starts the same uvicorn on a trivial ASGI app (it answers its process id, so
what is measured is the accept, not the app) twice: on one shared socket, as `gristmill
api` runs today, and with one ``SO_REUSEPORT`` socket a process, where the kernel
spreads connections by a hash of their addresses. Each wave opens ``--connections`` at
once and keeps them open; it reports, per wave, the connections each process took and
the largest share against an even one (max / mean).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

from gristmill.devservices.ports import free_port

HOST = "127.0.0.1"


async def pid_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers every request with the process id that served it."""
    if scope["type"] != "http":
        return
    body = str(os.getpid()).encode()
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _reuseport_process(port: int) -> None:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((HOST, port))
    sock.listen(2048)
    config = uvicorn.Config("bench.accept_spread:pid_app", log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


async def _connect(port: int) -> tuple[str, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(b"GET / HTTP/1.1\r\nHost: spread\r\n\r\n")
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return (await reader.readexactly(length)).decode(), writer


async def _waves(port: int, connections: int, waves: int) -> list[list[int]]:
    held: list[asyncio.StreamWriter] = []
    counts = []
    for _ in range(waves):
        got = await asyncio.gather(*(_connect(port) for _ in range(connections)))
        held += [w for _, w in got]
        counts.append(sorted(collections.Counter(pid for pid, _ in got).values(), reverse=True))
    for w in held:
        w.close()
    return counts


async def _wait_listening(port: int, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while True:
        try:
            _, w = await _connect(port)
            w.close()
            return
        except OSError:
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.2)


def measure(mode: str, processes: int, connections: int, waves: int) -> dict[str, Any]:
    port = free_port(HOST)
    procs: list[Any] = []
    if mode == "shared":
        app = "bench.accept_spread:pid_app"
        argv = [sys.executable, "-m", "uvicorn", app, "--host", HOST, "--port", str(port)]
        argv += ["--workers", str(processes), "--log-level", "warning"]
        procs.append(subprocess.Popen(argv))
    else:
        ctx = mp.get_context("spawn")
        procs += [ctx.Process(target=_reuseport_process, args=(port,)) for _ in range(processes)]
        for p in procs:
            p.start()
    try:
        asyncio.run(_wait_listening(port))
        time.sleep(2.0)  # every process up and waiting, not only the first
        counts = asyncio.run(_waves(port, connections, waves))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait() if isinstance(p, subprocess.Popen) else p.join()
    even = connections / processes
    return {
        "mode": mode,
        "processes": processes,
        "connections": connections,
        "by_process": counts,
        "max_over_mean": [round(c[0] / even, 2) for c in counts],
        "median_max_over_mean": round(statistics.median(c[0] / even for c in counts), 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--connections", type=int, default=400, help="opened at once, each wave")
    ap.add_argument("--waves", type=int, default=3)
    ap.add_argument("--modes", default="shared,reuseport")
    args = ap.parse_args(argv)
    rows = []
    for mode in args.modes.split(","):
        row = measure(mode, args.processes, args.connections, args.waves)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
