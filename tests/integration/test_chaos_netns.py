"""gristmill/chaos/netns.py and relay.py: a process in a namespace reaches a service on
the host's loopback through its veth pair, loses it when the pair is cut, and has it
again when joined. Needs root and iproute2 (skipped otherwise); no Kafka or PostgreSQL:
a small echo server stands in for a service, and another for an API's own port."""

from __future__ import annotations

import socket
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gristmill.chaos import netns


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(1024):
            self.request.sendall(data)


@pytest.fixture
def echo() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def _inside(net: netns.Netns, port: int, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Connect from inside the namespace to 127.0.0.1:port and echo a line."""
    code = (
        "import socket,sys\n"
        f"s=socket.create_connection(('127.0.0.1',{port}),timeout={timeout_s})\n"
        "s.sendall(b'ping');print(s.recv(4).decode())"
    )
    return subprocess.run(
        [*net.prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=30
    )


@pytest.mark.skipif(not netns.available(), reason="no network namespaces here (root, iproute2)")
def test_a_cut_link_drops_the_service_and_a_heal_brings_it_back(echo: int, tmp_path: Path) -> None:
    net = netns.Netns(9, kafka_ports=[echo], pg_port=echo + 1 if echo < 65535 else echo - 1)
    net.links["postgres"].ports = []  # one service is enough here
    try:
        net.create(tmp_path)
        assert _inside(net, echo, 5).stdout.strip() == "ping"
        net.cut("kafka")
        gone = _inside(net, echo, 2)
        assert gone.returncode != 0 and "ping" not in gone.stdout  # the packets are dropped
        net.heal("kafka")
        assert _inside(net, echo, 5).stdout.strip() == "ping"
    finally:
        net.destroy()
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert net.name not in left


@pytest.mark.skipif(not netns.available(), reason="no network namespaces here (root, iproute2)")
def test_the_api_port_is_relayed_in_and_survives_a_cut(tmp_path: Path) -> None:
    # A server inside the namespace (the API), reached from the host's loopback.
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    api_port = port.getsockname()[1]
    port.close()
    net = netns.Netns(8, kafka_ports=[], pg_port=1, inbound=[api_port])
    net.links["postgres"].ports = []
    server = None
    try:
        net.create(tmp_path)
        code = (
            "import socketserver\n"
            "class H(socketserver.BaseRequestHandler):\n"
            "    def handle(self):\n"
            "        self.request.sendall(self.request.recv(4))\n"
            f"socketserver.TCPServer(('127.0.0.1',{api_port}),H).serve_forever()"
        )
        server = subprocess.Popen([*net.prefix, sys.executable, "-c", code])
        net.cut("kafka")
        net.cut("postgres")
        for _ in range(50):
            try:
                with socket.create_connection(("127.0.0.1", api_port), timeout=2) as c:
                    c.sendall(b"pong")
                    if c.recv(4) == b"pong":
                        break
            except OSError:
                pass
            threading.Event().wait(0.1)
        else:
            pytest.fail("the API's port was not reachable through the relay")
    finally:
        if server is not None:
            server.kill()
            server.wait()
        net.destroy()
