"""The dev/test servers themselves: a real Kafka round trip, a PostgreSQL restart, and
nothing left running when the command that started a whole system is killed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from core.config import KafkaSettings
from core.kafka import admin_config, consumer_config, producer_config
from gristmill.devservices import KafkaCluster, PostgresServer
from gristmill.devservices.ports import port_open

pytestmark = pytest.mark.e2e


@pytest.fixture
def pg_workdir() -> Iterator[Path]:
    # As root the server runs as an unprivileged user, which cannot enter pytest's
    # mode-0700 basetemp; use a short, world-traversable directory instead.
    path = Path(tempfile.mkdtemp(prefix="gm-pg-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_kafka_single_node_produce_consume(tmp_path: Path) -> None:
    kafka = KafkaCluster(tmp_path / "kafka", n_brokers=1, partitions=3)
    with kafka:
        topic = f"devservices-{uuid.uuid4().hex[:8]}"
        kafka_settings = KafkaSettings(kafka_bootstrap=kafka.bootstrap)
        admin = AdminClient(admin_config(kafka_settings))
        metadata = admin.list_topics(timeout=10)
        assert set(metadata.brokers) == {0}
        # auto.create.topics.enable=false, so the topic must be created explicitly.
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[
            topic
        ].result(timeout=30)

        delivered: list[str | None] = []

        def on_delivery(err: KafkaError | None, msg: object) -> None:
            delivered.append(None if err is None else str(err))

        producer = Producer(producer_config(kafka_settings))
        producer.produce(topic, key=b"k1", value=b"hello gristmill", on_delivery=on_delivery)
        assert producer.flush(30) == 0
        assert delivered == [None]

        consumer = Consumer(
            consumer_config(
                kafka_settings,
                f"devservices-test-{uuid.uuid4().hex[:8]}",
                **{"auto.offset.reset": "earliest", "enable.auto.commit": False},
            )
        )
        try:
            consumer.subscribe([topic])
            received = None
            deadline = time.monotonic() + 30
            while received is None and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                assert msg.error() is None, msg.error()
                received = msg
            assert received is not None, "no message consumed within 30 s"
            assert received.topic() == topic
            assert received.key() == b"k1"
            assert received.value() == b"hello gristmill"
            consumer.commit(message=received, asynchronous=False)
        finally:
            consumer.close()
        port = int(kafka.bootstrap.rsplit(":", 1)[1])
    # The context manager stopped the JVM: nothing listens any more.
    assert not kafka.is_running(0)
    assert not port_open("127.0.0.1", port)


def test_postgres_start_restart_kill(pg_workdir: Path) -> None:
    server = PostgresServer(pg_workdir / "pg", fast=True)
    with server:
        assert server.url.startswith("postgresql+psycopg://gristmill@127.0.0.1:")
        assert server.url.endswith("/gristmill")
        with psycopg.connect(server.dsn) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
            conn.execute("create table kept (v int)")
            conn.execute("insert into kept values (42)")
        first_pid = server.pid

        server.restart()
        assert server.pid is not None and server.pid != first_pid
        with psycopg.connect(server.dsn) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
            assert conn.execute("select v from kept").fetchone() == (42,)

        # A crash (SIGKILL) followed by start(): committed data survives crash recovery.
        server.kill()
        assert not server.running
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(server.dsn, connect_timeout=2)
        server.start()
        with psycopg.connect(server.dsn) as conn:
            assert conn.execute("select v from kept").fetchone() == (42,)
    assert not server.running
    if os.geteuid() == 0:
        # The data directory belongs to the unprivileged server user, not to root.
        assert (pg_workdir / "pg" / "data").stat().st_uid != 0


# A test session's or a chaos run's system, started by a command that is then killed.
_SYSTEM_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    workdir, kind = Path(sys.argv[1]), sys.argv[2]
    if kind == "chaos":
        from gristmill.chaos.rig import own_services, running_rig
        services_cm = own_services(workdir / "services", n_brokers=1)
    else:
        from gristmill.devservices.stack import build_system, local_services
        services_cm = local_services(workdir / "services")
    with services_cm as services:
        if kind == "chaos":
            rig_cm = running_rig(services, workdir / "system", schedulers=1, apis=1, workers=1)
            system = rig_cm.__enter__().system
        else:
            (workdir / "system").mkdir()
            system = build_system(services, workdir / "system")
            system.start_scheduler(workers=1, models="sim")
            system.url = system.start_api()
            system.wait_until_serving("sim")
        print(json.dumps({
            "bootstrap": services.bootstrap, "database_url": services.database_url,
            "pg_data": str(services.postgres.data_dir), "api": system.url,
        }), flush=True)
        time.sleep(600)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["stack", "chaos"])
def test_kill9_of_the_command_running_a_system_leaves_nothing(pg_workdir: Path, kind: str) -> None:
    from tests.e2e.proctree import Tree

    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP", "DATABASE_URL")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    proc = subprocess.Popen(
        [sys.executable, "-c", _SYSTEM_SCRIPT, str(pg_workdir), kind],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    tree = Tree()
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "the system did not start"
        info = json.loads(line)
        tree.add(psutil.Process(proc.pid))
        tree.add_postmaster(Path(info["pg_data"]))
        assert len(tree.procs) >= 8  # Kafka, postmaster and backends, API, scheduler, worker
        for address in (info["bootstrap"], info["api"], info["database_url"]):
            tree.ports[int(address.rsplit(":", 1)[1].split("/")[0])] = address
        proc.kill()
        proc.wait()
        left = tree.leftovers_after(10)
        assert not left, f"still running 10 s after kill -9 of the {kind} command: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
        tree.kill_all()
