"""Throwaway Apache Kafka (KRaft mode) run straight from the Maven-fetched jars.

Every node is a combined broker+controller with a static ``controller.quorum.voters`` list,
so there is no ZooKeeper, no Docker and no tarball: just ``java -cp 'libs/*' kafka.Kafka``.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING
from xml.sax.saxutils import quoteattr

from core.config import KafkaSettings
from core.kafka import admin_config
from gristmill.devservices.kafka_jars import default_repo_root, ensure_kafka_jars
from gristmill.devservices.lifeline import Group, lifeline
from gristmill.devservices.ports import free_port, port_open
from gristmill.devservices.served import LOG_TAIL_LINES, Served, tail

if TYPE_CHECKING:  # only named in annotations; tls.py imports nothing from here
    from gristmill.devservices.tls import SaslSslListener

KAFKA_VERSION = "4.1.1"
HOST = "127.0.0.1"
STOP_GRACE_S = 20.0

# The heap is fixed and touched at start (Kafka's operations guide sizes -Xms as -Xmx):
# a heap left to grow took one step of 160 MiB half an hour into the hour-long soak.
_BROKER_JVM_OPTS = (
    "-Xms512m",
    "-Xmx512m",
    "-XX:+AlwaysPreTouch",
    "-XX:+UseG1GC",
    "-Djava.awt.headless=true",
)
# The storage formatter lives for about a second: C1-only JIT and SerialGC start faster.
_TOOL_JVM_OPTS = ("-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")

_LOG4J2_XML = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <File name="file" fileName={path} append="true">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Root level="WARN"><AppenderRef ref="file"/></Root>
  </Loggers>
</Configuration>
"""


class KafkaStartError(RuntimeError):
    """A Kafka node failed to format or to become ready; the message carries its log tail."""


def new_cluster_id() -> str:
    """A KRaft cluster id: a random UUID as 22 chars of URL-safe base64, like kafka-storage."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")


def _read_cluster_id(meta: Path) -> str | None:
    try:
        for line in meta.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() == "cluster.id":
                return value.strip()
    except OSError:
        pass
    return None


@dataclass
class _Node:
    index: int
    dir: Path
    port: int
    controller_port: int
    proc: subprocess.Popen[bytes] | None = None
    secure_port: int | None = None  # the SASL_SSL client listener's, when there is one
    held: Group | None = None  # by the lifeline while the JVM runs
    # Its files, all in ``dir``.
    data_dir: Path = field(init=False)
    config_path: Path = field(init=False)
    log4j_path: Path = field(init=False)
    out_path: Path = field(init=False)  # JVM stdout/stderr (crashes, log4j's own complaints)
    server_log: Path = field(init=False)  # log4j2 output at WARN and above

    def __post_init__(self) -> None:
        self.data_dir = self.dir / "data"
        self.config_path = self.dir / "server.properties"
        self.log4j_path = self.dir / "log4j2.xml"
        self.out_path = self.dir / "kafka.out"
        self.server_log = self.dir / "server.log"

    @property
    def node_id(self) -> int:
        return self.index

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tails(self) -> str:
        return (
            f"--- last {LOG_TAIL_LINES} lines of {self.out_path} ---\n{tail(self.out_path)}\n"
            f"--- last {LOG_TAIL_LINES} lines of {self.server_log} ---\n{tail(self.server_log)}"
        )


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    # Each JVM leads its own session (start_new_session=True), so its pgid is its pid.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


class KafkaCluster(Served):
    """One or more combined broker+controller Kafka nodes on 127.0.0.1 with fresh ports.

    Ports are chosen once in ``__init__`` and reused by ``restart`` because the static voter
    list names them. Data lives under ``workdir/node-<i>/data`` and survives stop/start (and a
    new object on the same workdir with the same ``n_brokers``). ``extra_config`` adds or
    overrides server.properties entries; ``extra_jvm_opts`` is appended to the JVM flags
    (``-XX:TieredStopAtLevel=1`` starts ~25% faster at some cost in peak throughput).
    """

    def __init__(
        self,
        workdir: Path,
        *,
        n_brokers: int = 1,
        partitions: int = 3,
        libs_dir: Path | None = None,
        java: str = "java",
        extra_config: Mapping[str, object] | None = None,
        extra_jvm_opts: Sequence[str] = (),
        secure: SaslSslListener | None = None,
    ) -> None:
        if n_brokers < 1:
            raise ValueError("n_brokers must be >= 1")
        if partitions < 1:
            raise ValueError("partitions must be >= 1")
        self.workdir = Path(workdir).resolve()
        self.n_brokers = n_brokers
        self.partitions = partitions
        self._libs_dir = libs_dir
        self._java = java
        self._extra_config = dict(extra_config or {})
        self._extra_jvm_opts = tuple(extra_jvm_opts)
        self._secure = secure
        self.cluster_id: str | None = None
        taken: set[int] = set()
        self._nodes = [
            _Node(
                index=i,
                dir=self.workdir / f"node-{i}",
                port=self._unique_port(taken),
                controller_port=self._unique_port(taken),
            )
            for i in range(n_brokers)
        ]
        if secure is not None:
            for node in self._nodes:
                node.secure_port = self._unique_port(taken)

    @staticmethod
    def _unique_port(taken: set[int]) -> int:
        # free_port() may hand the same number out twice in a row; every node needs its own.
        while (port := free_port(HOST)) in taken:
            pass
        taken.add(port)
        return port

    # ----------------------------------------------------------------- public API

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` for clients: "127.0.0.1:port,..." over all nodes."""
        return ",".join(node.address for node in self._nodes)

    @property
    def node_ids(self) -> list[int]:
        return [node.node_id for node in self._nodes]

    @property
    def secure_bootstrap(self) -> str:
        """``bootstrap.servers`` of the SASL_SSL listener (constructed with ``secure``)."""
        if self._secure is None:
            raise ValueError("this cluster has no SASL_SSL listener (pass secure=...)")
        return ",".join(f"{HOST}:{node.secure_port}" for node in self._nodes)

    def node_bootstrap(self, node_index: int) -> str:
        """The PLAINTEXT address of one node."""
        return self._node(node_index).address

    def is_running(self, node_index: int) -> bool:
        return self._node(node_index).running()

    def pid(self, node_index: int) -> int | None:
        """The running node's JVM (the leader of its process group), or None."""
        node = self._node(node_index)
        return node.proc.pid if node.proc is not None and node.running() else None

    def logtail(self, node_index: int) -> str:
        """The last lines of a node's JVM output and server.log, for error messages."""
        return self._node(node_index).log_tails()

    def start(self, timeout_s: float = 60) -> None:
        """Format (first time only) and start every node that is not running; wait for ready."""
        deadline = time.monotonic() + timeout_s
        to_start = [node for node in self._nodes if not node.running()]
        if not to_start:
            return
        libs = self._libs_dir or ensure_kafka_jars(default_repo_root())
        try:
            self._prepare(libs)
            for node in to_start:
                self._launch(node, libs)
            self._wait_ready(to_start, deadline)
        except BaseException:
            # Half a cluster is useless and would outlive the test; take it all down.
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM every node at once, wait up to 20 s for a clean exit, then SIGKILL."""
        self._terminate([node for node in self._nodes if node.proc is not None])

    def kill(self, node_index: int) -> None:
        """SIGKILL one node (no controlled shutdown), for chaos tests."""
        node = self._node(node_index)
        if node.proc is not None:
            _signal_group(node.proc, signal.SIGKILL)
            node.proc.wait()
            node.proc = None
            lifeline().release(node.held)

    def stop_node(self, node_index: int) -> None:
        """Gracefully stop one node (SIGTERM, SIGKILL after 20 s)."""
        self._terminate([self._node(node_index)])

    def restart(self, node_index: int, timeout_s: float = 60) -> None:
        """Stop one node if it runs (gracefully), start it again and wait until it serves."""
        deadline = time.monotonic() + timeout_s
        node = self._node(node_index)
        self._terminate([node])
        libs = self._libs_dir or ensure_kafka_jars(default_repo_root())
        self._write_config(node)
        self._launch(node, libs)
        try:
            self._wait_ready([node], deadline)
        except BaseException:
            self._terminate([node])
            raise

    # ----------------------------------------------------------------- internals

    def _node(self, node_index: int) -> _Node:
        if not 0 <= node_index < len(self._nodes):
            raise IndexError(f"node_index {node_index} out of range 0..{len(self._nodes) - 1}")
        return self._nodes[node_index]

    def _server_properties(self, node: _Node) -> str:
        n = len(self._nodes)
        replication = min(n, 3)
        # 3 nodes: RF 3 / min ISR 2 tolerates one dead node; 1 node must use 1 / 1.
        min_isr = 2 if n >= 3 else 1
        voters = ",".join(f"{m.node_id}@{HOST}:{m.controller_port}" for m in self._nodes)
        props: dict[str, object] = {
            "process.roles": "broker,controller",
            "node.id": node.node_id,
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{HOST}:{node.port},CONTROLLER://{HOST}:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{node.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": node.data_dir,
            "num.partitions": self.partitions,
            "auto.create.topics.enable": "false",
            "default.replication.factor": replication,
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": replication,
            "transaction.state.log.replication.factor": replication,
            "transaction.state.log.min.isr": min_isr,
            "share.coordinator.state.topic.replication.factor": replication,
            "share.coordinator.state.topic.min.isr": min_isr,
            # Tests start consumers immediately; the default 3 s join delay only slows them.
            "group.initial.rebalance.delay.ms": 0,
        }
        if self._secure is not None and node.secure_port is not None:
            # A SASL_SSL listener for clients beside PLAINTEXT (gristmill/devservices/tls.py).
            props.update(
                self._secure.properties(HOST, node.port, node.controller_port, node.secure_port)
            )
        # e.g. {"broker.session.timeout.ms": 4000} so a killed node is fenced (and may
        # re-register after restart) sooner than the 9 s default.
        props.update(self._extra_config)
        return "".join(f"{key}={value}\n" for key, value in props.items())

    def _write_config(self, node: _Node) -> None:
        node.dir.mkdir(parents=True, exist_ok=True)
        node.config_path.write_text(self._server_properties(node))
        node.log4j_path.write_text(_LOG4J2_XML.format(path=quoteattr(str(node.server_log))))

    def _prepare(self, libs: Path) -> None:
        """Write configs and format the storage of nodes that have never been formatted."""
        if shutil.which(self._java) is None and not Path(self._java).is_file():
            raise KafkaStartError(f"java executable {self._java!r} not found")
        for node in self._nodes:
            self._write_config(node)
        if self.cluster_id is None:
            # Reuse the id of an existing workdir so its data stays readable across runs.
            existing = (_read_cluster_id(n.data_dir / "meta.properties") for n in self._nodes)
            self.cluster_id = next((cid for cid in existing if cid), None) or new_cluster_id()
        unformatted = [n for n in self._nodes if not (n.data_dir / "meta.properties").is_file()]
        # Static controller.quorum.voters => plain "format -t"; --standalone and
        # --initial-controllers are only for dynamic quorums (controller.quorum.bootstrap.servers).
        formatters: list[tuple[_Node, subprocess.Popen[bytes]]] = []
        for node in unformatted:
            with open(node.dir / "format.log", "wb") as out:
                # Formatting runs in parallel: each one is a JVM start, the slow part.
                proc = self._spawn_java(
                    node,
                    libs,
                    out,
                    _TOOL_JVM_OPTS,
                    "kafka.tools.StorageTool",
                    "format",
                    # One token: an id may start with "-", which the parser would take
                    # for an option (base64url uses "-").
                    f"--cluster-id={self.cluster_id}",
                    "-c",
                    str(node.config_path),
                )
            formatters.append((node, proc))
        held = [lifeline().hold_group(p.pid, f"kafka format {p.pid}") for _, p in formatters]
        failures = []
        for (node, proc), hold in zip(formatters, held, strict=True):
            try:
                rc = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                rc = proc.wait()
            lifeline().release(hold)
            if rc != 0:
                failures.append(
                    f"node {node.index}: kafka-storage format exited {rc}:\n"
                    f"{tail(node.dir / 'format.log')}"
                )
        if failures:
            raise KafkaStartError("\n".join(failures))

    def _spawn_java(
        self, node: _Node, libs: Path, out: IO[bytes], jvm_opts: Sequence[str], *main: str
    ) -> subprocess.Popen[bytes]:
        """A JVM running ``main`` (a Kafka class and its arguments) in ``node``'s folder,
        with its log4j2 configuration, stdout and stderr into ``out``."""
        return subprocess.Popen(
            [
                self._java,
                *jvm_opts,
                f"-Dlog4j2.configurationFile={node.log4j_path}",
                "-cp",
                f"{libs}/*",
                *main,
            ],
            cwd=node.dir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            # Own session: Ctrl-C in the parent's terminal and our killpg stay separate.
            start_new_session=True,
        )

    def _launch(self, node: _Node, libs: Path) -> None:
        with open(node.out_path, "ab") as out:
            out.write(
                f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting node {node.index}\n".encode()
            )
            out.flush()
            node.proc = self._spawn_java(
                node,
                libs,
                out,
                [*_BROKER_JVM_OPTS, *self._extra_jvm_opts],
                "kafka.Kafka",
                str(node.config_path),
            )
        node.held = lifeline().hold_group(
            node.proc.pid, f"Kafka node {node.index} (port {node.port})"
        )

    def _wait_ready(self, nodes: Sequence[_Node], deadline: float) -> None:
        """Each node's PLAINTEXT port is open and its metadata lists every running broker."""
        from confluent_kafka.admin import AdminClient  # heavy import, only needed here

        for node in nodes:
            while not port_open(HOST, node.port):
                self._check_alive(node, deadline)
                time.sleep(0.1)
        for node in nodes:
            # Bootstrapping from this node alone makes it (not a peer) answer the metadata.
            admin = AdminClient(
                admin_config(KafkaSettings(kafka_bootstrap=node.address), log_level=2)
            )
            while True:
                self._check_alive(node, deadline)
                expected = {n.node_id for n in self._nodes if n.running()}
                remaining = max(0.5, min(5.0, deadline - time.monotonic()))
                try:
                    metadata = admin.list_topics(timeout=remaining)
                except Exception:  # KafkaException while the broker is still catching up
                    time.sleep(0.1)
                    continue
                if expected <= set(metadata.brokers):
                    break
                time.sleep(0.1)

    def _check_alive(self, node: _Node, deadline: float) -> None:
        if node.proc is None or node.proc.poll() is not None:
            rc = None if node.proc is None else node.proc.returncode
            raise KafkaStartError(
                f"Kafka node {node.index} exited during startup (rc={rc})\n{node.log_tails()}"
            )
        if time.monotonic() > deadline:
            raise KafkaStartError(
                f"Kafka node {node.index} not ready on {node.address} in time\n{node.log_tails()}"
            )

    def _terminate(self, nodes: Sequence[_Node]) -> None:
        live = [node for node in nodes if node.proc is not None]
        for node in live:
            assert node.proc is not None
            if node.proc.poll() is None:
                _signal_group(node.proc, signal.SIGTERM)
        # One shared grace period: all nodes shut down concurrently, the quorum included.
        deadline = time.monotonic() + STOP_GRACE_S
        for node in live:
            assert node.proc is not None
            try:
                node.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(node.proc, signal.SIGKILL)
                node.proc.wait()
            node.proc = None
            lifeline().release(node.held)


# The single-node case is "a broker"; same class, n_brokers defaults to 1.
KafkaBroker = KafkaCluster
