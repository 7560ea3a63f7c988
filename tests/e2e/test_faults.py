"""Single faults under load, each audited like the chaos suite does it.

One system for the module, on its own single-broker Kafka and PostgreSQL (these
tests kill them): two API instances, two schedulers in one consumer group. Every
test leaves it whole again. The sim model's test-only poison trigger is on.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from sqlalchemy import Engine, Text, cast, func, select

from core.kafka import admin_config, consumer_config
from core.models.sim import sim_output
from core.topics import dead_letter_topic
from gristmill.chaos.audit import AuditResult, audit, fetch_rows, unsettled
from gristmill.chaos.faults import Fault
from gristmill.chaos.ledger import CONN_ERROR, Ledger
from gristmill.chaos.load import LoadGenerator
from gristmill.chaos.recovery import measure
from gristmill.chaos.rig import Rig, own_services, running_rig
from gristmill.devservices.procs import sigkill, wait_gone
from results.db import make_engine
from results.schema import batches, requests
from scheduler.runtime.lane import lane_specs

POISON = "§poison§"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    workdir: Path = tmp_path_factory.mktemp("faults")
    env = {"GRISTMILL_SIM_POISON_PREFIX": POISON, "GRISTMILL_BATCH_TIMEOUT_S": "3"}
    with (
        own_services(workdir / "services", n_brokers=1) as services,
        running_rig(services, workdir / "system", extra_env=env) as r,
    ):
        yield r


@pytest.fixture(scope="module")
def engine(rig: Rig) -> Engine:
    return make_engine(rig.system.settings.database_url, pool_size=2)


@pytest.fixture(autouse=True)
def whole_again(rig: Rig) -> Iterator[None]:
    """Each test starts and ends with every component serving."""
    assert not rig.wait_ready(60)
    yield
    for name in rig.schedulers:
        if name not in rig.system.procs:
            rig.start_scheduler(name)
    for name in rig.apis:
        if name not in rig.system.procs:
            rig.start_api(name)
    assert not rig.wait_ready(90)


def under_load(
    rig: Rig,
    engine: Engine,
    fault: Callable[[], None],
    *,
    before_s: float = 3.0,
    after_s: float = 6.0,
    rate: float = 20.0,
) -> tuple[Ledger, AuditResult, float]:
    """Steady load, the fault, more load; then wait for every accepted request and audit."""
    ledger = Ledger()
    load = LoadGenerator(urls=rig.urls, keys=rig.system.keys, ledger=ledger, rate=rate)
    tenant_ids = list(rig.system.tenant_ids.values())
    load.start()
    time.sleep(before_s)
    t0 = time.time()
    fault()
    time.sleep(after_s)
    load.stop()
    prefix = f"chaos {load.run} "
    deadline = time.monotonic() + 90
    while True:
        rows = [r for r in fetch_rows(engine, tenant_ids) if str(r.input).startswith(prefix)]
        if unsettled(ledger.outcomes, [], rows) == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    result = audit(ledger.outcomes, [], rows, lambda t: "before" if t < t0 else "after")
    return ledger, result, t0


def assert_clean(result: AuditResult) -> None:
    t = result.total
    assert (t.lost, t.duplicated, t.wrong, result.stray_rows) == (0, 0, 0, 0), result.problems
    assert t.accepted > 0 and t.persisted == t.accepted


def ok_after(ledger: Ledger, t: float) -> list[int]:
    return [o.status for o in ledger.outcomes if o.sent_at >= t]


def test_postgres_restart_under_load_loses_nothing(rig: Rig, engine: Engine) -> None:
    pg = rig.services.postgres
    assert pg is not None
    back: list[float] = []

    def crash_and_start() -> None:
        pg.kill()  # a crash: every connection breaks at once
        time.sleep(1.0)
        pg.start()
        back.append(time.time())

    ledger, result, _ = under_load(rig, engine, crash_and_start, after_s=8)
    assert_clean(result)
    refused = [o for o in ledger.outcomes if o.status == 503]
    assert all(o.retry_after for o in refused), "a 503 must say when to retry"
    # The API and the schedulers recover by themselves: late requests all succeed.
    late = ok_after(ledger, back[0] + 4)
    assert late and all(s == 200 for s in late), late


def test_single_kafka_broker_restart_loses_nothing(rig: Rig, engine: Engine) -> None:
    kafka = rig.services.kafka
    assert kafka is not None and kafka.n_brokers == 1
    back: list[float] = []

    def kill_and_restart() -> None:
        kafka.kill(0)  # the only broker: a full Kafka outage
        time.sleep(2.0)
        kafka.restart(0)
        back.append(time.time())

    ledger, result, _ = under_load(rig, engine, kill_and_restart, after_s=10)
    assert_clean(result)
    during = [o for o in ledger.outcomes if o.status not in (200, 504)]
    assert all(o.status in (503, 0) for o in during), {o.status for o in during}
    late = ok_after(ledger, back[0] + 6)
    assert late and all(s == 200 for s in late), late


def test_scheduler_killed_the_other_takes_over_within_10s(rig: Rig, engine: Engine) -> None:
    faults: list[Fault] = []

    def kill_a() -> None:
        pid, workers = rig.pid("sched-a"), rig.workers("sched-a")
        faults.append(Fault(0, "scheduler", "sched-a", time.time()))
        sigkill(pid)
        rig.forget("sched-a")
        assert wait_gone(workers, 10), "workers must not outlive their scheduler"

    ledger, result, _ = under_load(rig, engine, kill_a, after_s=12)
    assert_clean(result)
    f = faults[0]
    measure(f, rig, engine, ledger, list(rig.system.tenant_ids.values()), timeout_s=5)
    assert f.partitions_s is not None
    # 6 s session timeout + a heartbeat + the rebalance; generous for a shared CI machine.
    assert f.partitions_s < 15, f"partitions processed again only after {f.partitions_s:.1f}s"


def test_api_killed_loses_no_accepted_request(rig: Rig, engine: Engine) -> None:
    def kill_api_a() -> None:
        os.killpg(rig.pid("api-a"), signal.SIGKILL)
        rig.forget("api-a")

    ledger, result, t0 = under_load(rig, engine, kill_api_a)
    assert_clean(result)
    via_b = [o.status for o in ledger.outcomes if o.api == 1 and o.sent_at >= t0]
    assert via_b and all(s == 200 for s in via_b), "the other instance keeps serving"


def test_sigterm_api_answers_what_it_had_and_leaves(rig: Rig, engine: Engine) -> None:
    """A rolling restart of the API: SIGTERM stops new connections, answers every request
    the instance already had, and exits; nothing it acknowledged is lost."""
    rcs: list[int | None] = []
    took: list[float] = []

    def sigterm_a() -> None:
        t = time.time()
        rcs.append(rig.system.stop("api-a", signal.SIGTERM, timeout_s=30))
        took.append(time.time() - t)

    ledger, result, t0 = under_load(rig, engine, sigterm_a, rate=40.0)
    assert_clean(result)
    # uvicorn re-raises the signal once its graceful shutdown is done, so the exit status
    # says "terminated by SIGTERM" (-15) rather than 0; either way it exited by itself.
    assert rcs[0] in (0, -signal.SIGTERM) and took[0] < 10, (rcs, took)
    # In flight at the signal (sent well before it, not answered by then): answered,
    # not cut off. Requests sent after it find the port closed and go elsewhere.
    in_flight = [o for o in ledger.outcomes if o.api == 0 and o.sent_at < t0 - 0.5 < t0 < o.done_at]
    cut = [o for o in in_flight if o.status == CONN_ERROR]
    assert not cut, f"{len(cut)} of {len(in_flight)} requests in flight were cut off"
    via_b = [o.status for o in ledger.outcomes if o.api == 1 and o.sent_at >= t0]
    assert via_b and all(s == 200 for s in via_b), "the other instance keeps serving"


def _committed_vs_end(rig: Rig) -> dict[tuple[str, int], tuple[int, int]]:
    s = rig.system.settings
    out = {}
    for spec in lane_specs(s):  # sync classes and job items are committed by their own groups
        c = Consumer(consumer_config(s, spec.group_id))
        try:
            tps = [TopicPartition(t, p) for t in spec.topics(s) for p in range(3)]
            for tp in c.committed(tps, timeout=10):
                _, high = c.get_watermark_offsets(tp, timeout=10)
                out[(tp.topic, tp.partition)] = (max(tp.offset, 0), high)
        finally:
            c.close()
    return out


def _members(rig: Rig) -> int:
    s = rig.system.settings
    admin = AdminClient(admin_config(s))
    fut = admin.describe_consumer_groups([s.consumer_group])[s.consumer_group]
    return len(fut.result(timeout=10).members)


def test_sigterm_scheduler_finishes_commits_and_leaves(rig: Rig, engine: Engine) -> None:
    rcs: list[int | None] = []
    left_at: list[float] = []
    # Each scheduler is one member per lane (decision 51); two schedulers, two sets.
    both = _members(rig)
    assert both % 2 == 0, both

    def sigterm_b() -> None:
        t = time.time()
        rcs.append(rig.system.stop("sched-b", signal.SIGTERM, timeout_s=30))
        left_at.append(time.time() - t)

    ledger, result, t0 = under_load(rig, engine, sigterm_b, after_s=5)
    assert_clean(result)
    assert rcs == [0] and left_at[0] < 10, (rcs, left_at)
    assert "scheduler stopped" in (rig.system.workdir / "sched-b.log").read_text()
    assert _members(rig) == both // 2, "it left the group (no wait for a session timeout)"
    # Handing over gracefully means nothing it persisted is computed again by the other
    # member: every batch formed since is referenced by exactly its own rows.
    with engine.connect() as conn:
        redone = conn.execute(
            select(batches.c.batch_id, batches.c.size, func.count(requests.c.request_id))
            .select_from(batches.outerjoin(requests, requests.c.batch_id == batches.c.batch_id))
            .where(batches.c.formed_at >= func.to_timestamp(t0 - 1))
            .group_by(batches.c.batch_id, batches.c.size)
            .having(func.count(requests.c.request_id) != batches.c.size)
        ).all()
    assert not redone, f"batches that re-ran persisted work: {redone}"
    # Requests during the handover were not held up by a session timeout.
    slow = [o for o in ledger.outcomes if o.status == 200 and o.done_at - o.sent_at > 5]
    assert not slow, f"{len(slow)} requests waited more than 5 s"
    # Nothing left uncommitted once the load is over.
    deadline = time.monotonic() + 10
    while (lag := {k: v for k, v in _committed_vs_end(rig).items() if v[0] != v[1]}) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.5)
    assert not lag, lag


async def _concurrent(
    rig: Rig, inputs: list[str], salt: str, timeout_ms: int
) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=timeout_ms / 1000 + 30) as client:
        return await asyncio.gather(
            *[
                client.post(
                    f"{rig.urls[0]}/v1/infer",
                    headers=rig.system.headers(),
                    json={
                        "model": "sim",
                        "input": x,
                        "params": {"salt": salt},
                        "timeout_ms": timeout_ms,
                    },
                )
                for x in inputs
            ]
        )


def _dead_letters(rig: Rig, want: str, timeout_s: float = 30) -> dict[str, str]:
    s = rig.system.settings
    c = Consumer(
        consumer_config(
            s, f"dlq-reader-{uuid.uuid4().hex[:6]}", **{"auto.offset.reset": "earliest"}
        )
    )
    c.subscribe([dead_letter_topic(s)])
    found: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while want not in found and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            headers = dict(msg.headers() or [])
            found[(msg.key() or b"").decode()] = (headers.get("error") or b"").decode()
    finally:
        c.close()
    return found


@pytest.mark.parametrize(
    "kind,size,expect",
    [("crash", 8, "crashed"), ("hang", 4, "hung")],
)
def test_poison_input_is_isolated_failed_and_dead_lettered(
    rig: Rig, engine: Engine, kind: str, size: int, expect: str
) -> None:
    salt = uuid.uuid4().hex[:8]  # these requests batch only with each other
    inputs = [f"neighbour {i} {salt}" for i in range(size - 1)]
    poison = f"{POISON}{kind} {salt}"
    inputs.insert(size // 2, poison)
    responses = asyncio.run(_concurrent(rig, inputs, salt, timeout_ms=120_000))
    by_input = dict(zip(inputs, responses, strict=True))
    for x in inputs:
        r = by_input[x]
        if x == poison:
            assert r.status_code == 422, r.text
            assert r.json()["error"]["code"] == "model_error"
            assert expect in r.json()["error"]["message"], r.text
        else:
            assert r.status_code == 200, r.text
            assert r.json()["output"] == sim_output(x, salt)
    with engine.connect() as conn:
        row = conn.execute(
            select(
                requests.c.request_id, requests.c.status, requests.c.error, requests.c.attempts
            ).where(requests.c.input == func.to_jsonb(cast(poison, Text)))
        ).one()
    assert row.status == "failed" and expect in row.error and "3 attempts" in row.error
    dead = _dead_letters(rig, str(row.request_id))
    assert str(row.request_id) in dead and expect in dead[str(row.request_id)]
