"""The TCP relay that joins a network namespace to the services outside it, so a chaos
run can cut one process off from Kafka or PostgreSQL for real (gristmill/chaos/netns.py).

Run as ``python -m gristmill.chaos.relay '<json>'``; one process per namespace, with
sockets on both sides (a socket belongs to the namespace its thread was in when it was
made: ``setns`` around each one). Three kinds of route:

* ``links``: a service port reached *through a veth pair*: inside the namespace it
  listens on 127.0.0.1:port (where Kafka's advertised listeners and DATABASE_URL point)
  and connects to the link's host address; on the host it listens on that address and
  connects to 127.0.0.1:port. Taking the link's host end down cuts the process off:
  packets are dropped, connections hang, as across a real partition.
* ``inbound``: a port of the process's own (the API's), listened on the host's
  127.0.0.1 and connected to inside the namespace directly, so clients still reach it
  while its links are cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Any

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
Connect = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


class Namespaces:
    def __init__(self, name: str):
        self.host = os.open("/proc/self/ns/net", os.O_RDONLY)
        self.inner = os.open(f"/run/netns/{name}", os.O_RDONLY)

    def _enter(self, fd: int) -> None:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns failed")

    def socket(self, inside: bool) -> socket.socket:
        """A TCP socket of the namespace (``inside``) or of the host."""
        if not inside:
            return socket.socket()
        self._enter(self.inner)
        try:
            return socket.socket()
        finally:
            self._enter(self.host)


async def _pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    try:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            w.close()


def _handler(connect: Connect) -> Callable[..., Awaitable[None]]:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            r2, w2 = await connect()
        except OSError:
            w.close()
            return
        await asyncio.gather(_pipe(r, w2), _pipe(r2, w))

    return handle


def _connector(ns: Namespaces, inside: bool, host: str, port: int) -> Connect:
    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        s = ns.socket(inside)
        s.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(s, (host, port))
        except BaseException:
            s.close()
            raise
        return await asyncio.open_connection(sock=s)

    return connect


async def _listen(ns: Namespaces, inside: bool, host: str, port: int, connect: Connect) -> Any:
    s = ns.socket(inside)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(512)
    s.setblocking(False)
    return await asyncio.start_server(_handler(connect), sock=s)


async def serve(spec: dict[str, Any]) -> None:
    ns = Namespaces(spec["ns"])
    servers = []
    for link in spec["links"]:
        via, port = link["host_addr"], link["port"]
        # host side of the link: the veth's host address -> the service on loopback
        to_service = _connector(ns, False, "127.0.0.1", port)
        servers.append(await _listen(ns, False, via, port, to_service))
        # namespace side: loopback in the namespace -> across the veth
        servers.append(await _listen(ns, True, "127.0.0.1", port, _connector(ns, True, via, port)))
    for port in spec["inbound"]:
        servers.append(
            await _listen(ns, False, "127.0.0.1", port, _connector(ns, True, "127.0.0.1", port))
        )
    print("relay ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for s in servers:
        s.close()


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    asyncio.run(serve(json.loads(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
