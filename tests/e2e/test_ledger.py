"""The durability ledger against a real system (issue 33 item 7, decision 54).

A real API, scheduler, Kafka and PostgreSQL; the ledger runs as ``gristmill ledger run``
and is read by ``gristmill ledger export``. A tenant's sync requests and a small job are
all accounted for (N accepted, N terminal, 0 missing), and stay so when the ledger
restarts. Then hostile cases: a message whose result row is deleted behind the
scheduler's back (a lost write) is reported missing by name and counted in the metrics;
a second copy of a request in Kafka is a duplicate, not a second request; a message
that names no request is counted for no tenant. Bad CLI input gets a clear error.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from sqlalchemy import Engine, delete, select

from core.messages import RequestMessage
from core.topics import request_topic
from gristmill.devservices.lifeline import lifeline
from gristmill.devservices.ports import free_port
from gristmill.devservices.stack import REPO, Services, System, build_system
from results.db import make_engine
from results.schema import requests
from results.tenants import create_tenant, issue_key, set_plan

pytestmark = pytest.mark.slow
LEDGER_ENV = {
    "GRISTMILL_LEDGER_STORE_INTERVAL_S": "0.5",
    "GRISTMILL_LEDGER_GRACE_S": "5",
}


@pytest.fixture(scope="module")
def system(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    workdir: Path = tmp_path_factory.mktemp("ledger")
    sys_ = build_system(services, workdir)
    try:
        sys_.start_scheduler(workers=1, models="sim")
        sys_.url = sys_.start_api()
        sys_.wait_until_serving("sim")
        yield sys_
    finally:
        sys_.close()


@pytest.fixture(scope="module")
def engine(system: System) -> Iterator[Engine]:
    e = make_engine(system.settings.database_url, pool_size=2)
    yield e
    e.dispose()


class Ledger:
    """``gristmill ledger run`` as a process of its own, held by the lifeline."""

    def __init__(self, system: System):
        self.system = system
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = system.workdir / "ledger.log"

    def start(self) -> None:
        env = {**self.system.env, **LEDGER_ENV, "GRISTMILL_LEDGER_METRICS_PORT": str(self.port)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gristmill", "ledger", "run"],
            env=env,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,
        )
        self.held = lifeline().hold_group(self.proc.pid, "ledger")

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(30)
        lifeline().release(self.held)
        self.proc = None
        return rc

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text


@pytest.fixture(scope="module")
def ledger(system: System) -> Iterator[Ledger]:
    led = Ledger(system)
    try:
        yield led
    finally:
        if led.proc is not None:
            led.proc.kill()
            led.proc.wait()


def new_tenant(system: System, engine: Engine) -> tuple[str, str]:
    """A tenant of its own, so the export's counts are this test's alone: (id, key)."""
    with engine.begin() as conn:
        t = create_tenant(conn, f"ledger-{uuid.uuid4().hex[:8]}", "paid")
        set_plan(conn, t.name, rate_rps=1e6, burst=1e6, job_items_per_s=1e9)
        return t.id, issue_key(conn, t)[1]


def run_cli(system: System, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gristmill", "ledger", *args],
        env=system.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def export(system: System, tenant: str, since: datetime, until: datetime) -> dict[str, Any]:
    r = run_cli(
        system,
        "export",
        "--tenant",
        tenant,
        "--since",
        since.isoformat(),
        "--until",
        until.isoformat(),
    )
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def settled_export(
    system: System, tenant: str, since: datetime, want_accepted: int, timeout_s: float = 90
) -> dict[str, Any]:
    """The export once the ledger has read and settled ``want_accepted`` requests."""
    until = datetime.now(UTC) + timedelta(minutes=2)
    deadline = time.monotonic() + timeout_s
    out: dict[str, Any] = {}
    while time.monotonic() < deadline:
        out = export(system, tenant, since, until)
        if out["accepted"] >= want_accepted and out["pending"] == 0:
            return out
        time.sleep(0.5)
    raise AssertionError(f"the ledger did not settle: {out}")


def test_a_tenants_requests_and_job_are_all_accounted_for(
    system: System, engine: Engine, ledger: Ledger
) -> None:
    since = datetime.now(UTC) - timedelta(minutes=1)
    tenant, key = new_tenant(system, engine)
    auth = {"Authorization": f"Bearer {key}"}
    for i in range(20):
        r = httpx.post(
            f"{system.url}/v1/infer", headers=auth, json={"model": "sim", "input": f"x{i}"}
        )
        assert r.status_code == 200, r.text
    items = [{"input": f"item {i}"} for i in range(7)]
    r = httpx.post(
        f"{system.url}/v1/jobs", headers=auth, json={"model": "sim", "items": items}, timeout=60
    )
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    deadline = time.monotonic() + 60
    while httpx.get(f"{system.url}/v1/jobs/{job_id}", headers=auth).json()["status"] != "completed":
        assert time.monotonic() < deadline, "the job did not complete"
        time.sleep(0.5)

    ledger.start()
    out = settled_export(system, tenant, since, 27)
    assert (out["accepted"], out["terminal"], out["missing"], out["pending"]) == (27, 27, 0, 0)
    assert out["duplicates"] == 0 and out["missing_request_ids"] == []
    # A period that has ended and been read past is complete.
    old = export(system, tenant, since - timedelta(minutes=5), since - timedelta(minutes=4))
    assert old["complete"] is True and old["accepted"] == 0

    # A restart reads on from its stored position: nothing is counted twice.
    assert ledger.stop() == 0
    ledger.start()
    time.sleep(3)
    again = settled_export(system, tenant, since, 27)
    assert (again["accepted"], again["terminal"], again["missing"]) == (27, 27, 0)
    assert ledger.stop() == 0


def _produce(system: System, tp: TopicPartition, value: bytes) -> int:
    """Write ``value`` to one partition (acks=all); its offset."""
    p = Producer({"bootstrap.servers": system.settings.kafka_bootstrap, "acks": "all"})
    got: list[int] = []
    p.produce(
        tp.topic, value, partition=tp.partition, on_delivery=lambda e, m: got.append(m.offset())
    )
    p.flush(30)
    assert got, "not produced"
    return got[0]


def _wait_committed_past(system: System, tp: TopicPartition, offset: int) -> None:
    admin = AdminClient({"bootstrap.servers": system.settings.kafka_bootstrap})
    group = system.settings.consumer_group
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        futs = admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group, [TopicPartition(tp.topic, tp.partition)])]
        )
        res = next(iter(futs.values())).result()
        if (res.topic_partitions or [])[0].offset > offset:
            return
        time.sleep(0.2)
    raise AssertionError("the scheduler did not commit past the message")


def _row(engine: Engine, request_id: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            select(requests.c.status, requests.c.kafka_offset).where(
                requests.c.request_id == request_id
            )
        ).first()


def test_a_lost_write_a_duplicate_and_garbage(
    system: System, engine: Engine, ledger: Ledger
) -> None:
    """With the ledger stopped: a request whose row is deleted after the scheduler
    committed past it (a lost write, behind its back), a request produced twice (a
    producer's retry), a message that names no request. The ledger, started, names the
    lost one and counts the twice-produced one once."""
    since = datetime.now(UTC) - timedelta(minutes=1)
    tenant, _key = new_tenant(system, engine)
    topic = request_topic(system.settings, "paid")

    def message() -> RequestMessage:
        now = time.time()
        return RequestMessage(
            request_id=str(uuid.uuid4()),
            tenant_id=tenant,
            priority="paid",
            model="sim",
            version="1",
            input="ledger",
            params={},
            deadline=now + 30,
            received_at=now,
        )

    lost, twice = message(), message()
    lost_tp = TopicPartition(topic, 0)
    lost_at = _produce(system, lost_tp, lost.encode())
    _produce(system, TopicPartition(topic, 1), twice.encode())
    _produce(system, TopicPartition(topic, 2), twice.encode())
    _produce(system, TopicPartition(topic, 2), b"\x00 not a request")
    _wait_committed_past(system, lost_tp, lost_at)
    deadline = time.monotonic() + 30
    while _row(engine, twice.request_id) is None:
        assert time.monotonic() < deadline, "the twice-produced request got no row"
        time.sleep(0.2)
    assert _row(engine, lost.request_id) is not None
    with engine.begin() as conn:
        conn.execute(delete(requests).where(requests.c.request_id == lost.request_id))

    ledger.start()
    out = settled_export(system, tenant, since, 2)
    assert (out["accepted"], out["terminal"], out["missing"], out["pending"]) == (2, 1, 1, 0)
    assert out["duplicates"] == 1
    assert out["missing_request_ids"] == [lost.request_id]
    text = ledger.metrics()
    assert 'gristmill_ledger_messages_total{outcome="missing"} 1.0' in text
    assert 'gristmill_ledger_messages_total{outcome="unreadable"}' in text
    assert "gristmill_ledger_overdue 0.0" in text
    assert ledger.stop() == 0


T = str(uuid.uuid4())
HOSTILE = [
    (["--tenant", "acme", "--since", "2026-01-01", "--until", "2026-01-02"], "--tenant"),
    (["--tenant", "'; drop", "--since", "2026-01-01", "--until", "2026-01-02"], "--tenant"),
    (["--tenant", T, "--since", "yesterday", "--until", "2026-01-02"], "--since"),
    (["--tenant", T, "--since", "2026-01-01", "--until", "2026-13-40"], "--until"),
    (["--tenant", T, "--since", "2026-01-02", "--until", "2026-01-01"], "--since"),
    (["--tenant", T, "--since", "2026-01-01", "--until", "9999-12-31T23:59:59"], "--until"),
]


@pytest.mark.parametrize(("args", "names"), HOSTILE)
def test_hostile_export_input_gets_a_clear_error(
    system: System, args: list[str], names: str
) -> None:
    r = run_cli(system, "export", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and names in r.stderr
    assert r.stdout == ""


def test_an_unknown_tenant_exports_zeros(system: System) -> None:
    now = datetime.now(UTC)
    out = export(system, str(uuid.uuid4()), now - timedelta(hours=1), now)
    assert (out["accepted"], out["terminal"], out["missing"], out["pending"]) == (0, 0, 0, 0)
