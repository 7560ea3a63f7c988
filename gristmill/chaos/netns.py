"""Network partitions for chaos runs: a scheduler or an API instance runs in a network
namespace of its own, joined to Kafka and to PostgreSQL by one veth pair each, and a
fault takes a pair's host end down (``cut``) and up again (``heal``): the process is
cut off from that service at the network layer - its packets dropped, its connections
hanging - while everything else runs on.

Kafka and PostgreSQL listen on the host's loopback (Kafka advertises it), so a relay
(gristmill/chaos/relay.py) listens on the namespace's loopback and carries each
connection across its veth pair to the host; an API's own port is relayed straight
in, so clients still reach it during the cut. Needs root and ``ip`` (iproute2):
``available()`` says whether this machine allows it; the runner skips partitions
otherwise, and says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from gristmill.devservices.lifeline import Group, lifeline

SERVICES = ("kafka", "postgres")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def available() -> bool:
    """Root, iproute2, and the kernel lets us make a namespace and a veth pair."""
    if os.geteuid() != 0:
        return False
    probe = f"gmprobe{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
        _ip("link", "add", f"{probe}a", "type", "veth", "peer", "name", f"{probe}b")
        _ip("link", "del", f"{probe}a")
        return True
    except (OSError, subprocess.CalledProcessError):
        return False
    finally:
        _ip("netns", "del", probe, check=False)


@dataclass
class Link:
    service: str
    host_if: str
    ns_if: str
    host_addr: str
    ns_addr: str
    ports: list[int]


@dataclass
class Netns:
    """One namespace: ``index`` (unique in the run) picks its interface names and its
    addresses, 10.77.<index>.0/30 to Kafka and 10.77.<index>.4/30 to PostgreSQL."""

    index: int
    kafka_ports: list[int]
    pg_port: int
    inbound: list[int] = field(default_factory=list)
    name: str = ""
    links: dict[str, Link] = field(default_factory=dict)
    relay: subprocess.Popen[bytes] | None = None
    held: Group | None = None
    cut_now: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.name = f"gmc{os.getpid()}-{self.index}"
        for k, (service, ports) in enumerate(
            (("kafka", self.kafka_ports), ("postgres", [self.pg_port]))
        ):
            base = 4 * k
            self.links[service] = Link(
                service,
                f"gm{self.index}{service[0]}h",
                f"gm{self.index}{service[0]}n",
                f"10.77.{self.index}.{base + 1}",
                f"10.77.{self.index}.{base + 2}",
                ports,
            )

    @property
    def prefix(self) -> list[str]:
        """What runs a command inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def create(self, log_dir: Path) -> None:
        self.destroy()  # what a killed run may have left under these names
        _ip("netns", "add", self.name)
        _ip("-n", self.name, "link", "set", "lo", "up")
        for link in self.links.values():
            _ip("link", "add", link.host_if, "type", "veth", "peer", "name", link.ns_if)
            _ip("link", "set", link.ns_if, "netns", self.name)
            _ip("addr", "add", f"{link.host_addr}/30", "dev", link.host_if)
            _ip("link", "set", link.host_if, "up")
            _ip("-n", self.name, "addr", "add", f"{link.ns_addr}/30", "dev", link.ns_if)
            _ip("-n", self.name, "link", "set", link.ns_if, "up")
        self._start_relay(log_dir / f"relay-{self.name}.log")

    def _start_relay(self, log_path: Path) -> None:
        spec = {
            "ns": self.name,
            "links": [
                {"host_addr": link.host_addr, "port": p}
                for link in self.links.values()
                for p in link.ports
            ],
            "inbound": self.inbound,
        }
        log = log_path.open("ab")
        self.relay = subprocess.Popen(
            [sys.executable, "-m", "gristmill.chaos.relay", json.dumps(spec)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.held = lifeline().hold_group(self.relay.pid, f"chaos relay {self.name}")
        deadline = time.monotonic() + 10
        while b"relay ready" not in log_path.read_bytes():
            if self.relay.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the relay of {self.name} did not start; see {log_path}")
            time.sleep(0.05)

    def cut(self, service: str) -> None:
        _ip("link", "set", self.links[service].host_if, "down")
        self.cut_now.add(service)

    def heal(self, service: str) -> None:
        _ip("link", "set", self.links[service].host_if, "up")
        self.cut_now.discard(service)

    def destroy(self) -> None:
        if self.relay is not None:
            with contextlib.suppress(ProcessLookupError):
                self.relay.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.relay.wait(5)
            if self.relay.poll() is None:
                self.relay.kill()
            lifeline().release(self.held)
            self.relay = None
        for link in self.links.values():
            _ip("link", "del", link.host_if, check=False)  # its peer goes with it
        _ip("netns", "del", self.name, check=False)
