"""The dev/test servers themselves: a real Kafka round trip and a PostgreSQL restart."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

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
