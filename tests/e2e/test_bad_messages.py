"""Poisoned messages straight into Kafka never stop a partition (issue 13 items 2 and 9).

Messages the API would never produce are written to the request topic directly, into
every partition (so into the partition of every ordinary request sent meanwhile): a
NUL in the input, a NUL in the params, bytes that are not JSON, an object with a
field of the wrong type. Every ordinary request is answered; each poisoned message
gets a dead-letter copy and, when it names its request, a `failed` row PostgreSQL can
hold; the offsets move past all of them, and a restarted scheduler reads none again.
Also here: the persister against the real database, and the start-up durability check.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from sqlalchemy import Engine, select

from core.messages import RequestMessage
from core.models.sim import sim_output
from core.topics import dead_letter_topic, request_topic
from core.vocab import RequestStatus
from gristmill.devservices.stack import Services, System, build_system
from results.db import make_engine
from results.durability import check_durability
from results.schema import batches, requests
from results.store import persist
from scheduler.core.batcher import Batch, BatchKey, Pending
from scheduler.core.plans import Write
from scheduler.runtime.deadletter import DeadLetters
from scheduler.runtime.lane import lane_specs
from scheduler.runtime.persister import Persister

PARTITIONS = 3
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def system(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """Its own topics and scheduler (one worker): this module restarts the scheduler. A
    500 ms linger gathers what arrives together into one batch."""
    workdir: Path = tmp_path_factory.mktemp("bad-messages")
    sys_ = build_system(services, workdir, extra_env={"GRISTMILL_MAX_LINGER_MS": "500"})
    try:
        sys_.start_scheduler(workers=1, models="sim")
        sys_.url = sys_.start_api()
        sys_.wait_until_serving("sim")
        yield sys_
    finally:
        sys_.close()


@pytest.fixture(scope="module")
def engine(system: System) -> Engine:
    return make_engine(system.settings.database_url, pool_size=2)


def _message(system: System, input_: Any, params: dict[str, Any]) -> RequestMessage:
    now = time.time()
    return RequestMessage(
        request_id=str(uuid.uuid4()),
        tenant_id=system.tenant_ids["paid"],
        priority="paid",
        model="sim",
        version="1",
        input=input_,
        params=params,
        deadline=now + 30,
        received_at=now,
    )


def _dead_letters(system: System, source_topic: str) -> list[tuple[dict[str, str], bytes]]:
    """Every copy in the dead-letter topic of a message read from ``source_topic``:
    (headers, value)."""
    s = system.settings
    c = Consumer(
        {
            "bootstrap.servers": s.kafka_bootstrap,
            "group.id": f"dlq-reader-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    tps = [TopicPartition(dead_letter_topic(s), p) for p in range(PARTITIONS)]
    ends = {tp.partition: c.get_watermark_offsets(tp, timeout=10)[1] for tp in tps}
    c.assign(tps)
    out: list[tuple[dict[str, str], bytes]] = []
    seen = dict.fromkeys(ends, 0)
    deadline = time.monotonic() + 20
    while any(seen[p] < ends[p] for p in ends) and time.monotonic() < deadline:
        msg = c.poll(0.5)
        if msg is None or msg.error() is not None:
            continue
        seen[msg.partition()] = msg.offset() + 1  # type: ignore[index,operator]
        raw: Any = msg.headers() or []
        headers = {str(k): bytes(v or b"").decode() for k, v in raw}
        if headers.get("source_topic") == source_topic:
            out.append((headers, msg.value() or b""))
    c.close()
    return out


def _committed_vs_end(system: System) -> dict[tuple[str, int], tuple[int, int]]:
    s = system.settings
    (sync,) = [spec for spec in lane_specs(s) if spec.name == "paid"]
    c = Consumer({"bootstrap.servers": s.kafka_bootstrap, "group.id": sync.group_id})
    try:
        tps = [TopicPartition(request_topic(s, "paid"), p) for p in range(PARTITIONS)]
        out = {}
        for tp in c.committed(tps, timeout=10):
            _, high = c.get_watermark_offsets(tp, timeout=10)
            out[(tp.topic, tp.partition)] = (max(tp.offset, 0), high)
        return out
    finally:
        c.close()


def _settled(system: System, timeout_s: float = 20) -> dict[tuple[str, int], tuple[int, int]]:
    deadline = time.monotonic() + timeout_s
    while True:
        state = _committed_vs_end(system)
        lagging = {k: v for k, v in state.items() if v[0] != v[1]}
        if not lagging or time.monotonic() > deadline:
            return lagging
        time.sleep(0.5)


async def _infer_all(system: System, inputs: list[str], salt: str) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30) as client:
        return await asyncio.gather(
            *[
                client.post(
                    f"{system.url}/v1/infer",
                    headers=system.headers("paid"),
                    json={"model": "sim", "input": x, "params": {"salt": salt}},
                )
                for x in inputs
            ]
        )


def test_poisoned_messages_are_recorded_and_skipped_and_never_read_again(
    system: System, engine: Engine
) -> None:
    s = system.settings
    topic = request_topic(s, "paid")
    salt = uuid.uuid4().hex[:8]
    assert _dead_letters(system, topic) == []
    producer = Producer({"bootstrap.servers": s.kafka_bootstrap, "acks": "all"})
    poisons: dict[str, list[tuple[int, str | None]]] = {k: [] for k in "abcd"}
    placed: dict[tuple[int, int], str] = {}  # (partition, offset) -> kind

    def sent(kind: str, p: int) -> Any:
        def done(err: Any, msg: Any) -> None:
            assert err is None, err
            placed[(msg.partition(), msg.offset())] = kind

        return done

    for p in range(PARTITIONS):
        nul_input = _message(system, f"poison\x00input {salt}", {"salt": salt})  # batches with ours
        nul_params = _message(system, f"poison params {salt}", {"salt": f"x\x00{salt}"})
        wrong = orjson.loads(_message(system, "wrong", {"salt": salt}).encode())
        wrong["deadline"] = "tomorrow"
        for kind, rid, value in (
            ("a", nul_input.request_id, nul_input.encode()),
            ("b", nul_params.request_id, nul_params.encode()),
            ("c", None, b"\xff\x00 not json {"),
            ("d", wrong["request_id"], orjson.dumps(wrong)),
        ):
            producer.produce(topic, value=value, partition=p, on_delivery=sent(kind, p))
            poisons[kind].append((p, rid))
    assert producer.flush(10) == 0
    # Ordinary requests through the API, right behind them in the same topic.
    inputs = [f"ordinary {i} {salt}" for i in range(30)]
    responses = asyncio.run(_infer_all(system, inputs, salt))
    for x, r in zip(inputs, responses, strict=True):
        assert r.status_code == 200, r.text
        assert r.json()["output"] == sim_output(x, salt)

    # Every poisoned message that names its request has a failed row it could store.
    ids = {kind: [rid for _, rid in v if rid] for kind, v in poisons.items()}
    named = [*ids["a"], *ids["b"], *ids["d"]]
    deadline = time.monotonic() + 60  # isolating a row takes a few more transactions
    while True:
        with engine.connect() as conn:
            rows = {
                str(r.request_id): r
                for r in conn.execute(select(requests).where(requests.c.request_id.in_(named)))
            }
        if len(rows) == len(named) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    with engine.connect() as conn:
        ours = conn.execute(
            select(requests.c.batch_id, requests.c.kafka_partition, requests.c.kafka_offset).where(
                requests.c.request_id.in_([r.json()["request_id"] for r in responses])
            )
        ).all()
    assert len(rows) == 9, sorted(rows)
    for rid in ids["a"]:
        row = rows[rid]
        assert row.status == "failed" and "could not be stored" in row.error, row.error
        assert row.input == f"poison\\u0000input {salt}"  # readable, not lost
    for rid in ids["b"]:
        row = rows[rid]
        assert row.status == "failed" and "could not be stored" in row.error
        assert row.params == {"salt": f"x\\u0000{salt}"}
    for rid in ids["d"]:
        assert rows[rid].status == "failed" and "deadline" in rows[rid].error
    # The NUL inputs rode in a batch with ordinary requests, which were answered.
    shared = {rows[rid].batch_id for rid in ids["a"]} & {b for b, _, _ in ours}
    assert shared, "the poisoned inputs shared no batch with ordinary requests"
    # Ordinary requests after a poisoned message in its partition were not held back.
    poisoned_at = {p: min(o for (q, o) in placed if q == p) for p in range(PARTITIONS)}
    assert all(o > poisoned_at[p] for _, p, o in ours)

    # Each poisoned message has one dead-letter copy naming where it was read.
    deadline = time.monotonic() + 30
    while len(letters := _dead_letters(system, topic)) < len(placed):
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    by_source = {(int(h["source_partition"]), int(h["source_offset"])): (h, v) for h, v in letters}
    assert len(letters) == len(placed) == 12 and set(by_source) == set(placed)
    for where, kind in placed.items():
        headers, value = by_source[where]
        if kind == "c":
            assert value == b"\xff\x00 not json {" and "not JSON" in headers["error"]
        else:
            assert orjson.loads(value)["request_id"] in rows
    # ... and the offsets moved past all of them.
    assert not _settled(system), "a partition's offsets did not move past its poison"

    # A restarted scheduler reads none of them again.
    log = system.workdir / "scheduler.log"
    size = log.stat().st_size
    assert system.stop("scheduler") == 0
    system.start_scheduler(workers=1, models="sim")
    system.wait_until_serving("sim")
    time.sleep(3)
    assert len(_dead_letters(system, topic)) == 12, "poisoned messages were read again"
    again = log.read_bytes()[size:].decode(errors="replace")
    assert "unreadable message" not in again and "cannot be stored" not in again, again
    with engine.connect() as conn:
        now = {
            str(r.request_id): r.persisted_at
            for r in conn.execute(
                select(requests.c.request_id, requests.c.persisted_at).where(
                    requests.c.request_id.in_(list(rows))
                )
            )
        }
    assert now == {rid: r.persisted_at for rid, r in rows.items()}
    assert not _settled(system)


def _pending(system: System, i: int, input_: str, salt: str) -> Pending:
    m = _message(system, input_, {"salt": salt})
    return Pending(m, BatchKey("sim", "1", (("salt", salt),)), 1, ("direct", 0), i, time.time())


def test_the_persister_isolates_rows_the_database_refuses(system: System, engine: Engine) -> None:
    """The persister alone against the real database and broker: a write of six rows,
    two of them unstorable, then a write whose batch row is unstorable too."""
    s = system.settings
    producer = Producer({"bootstrap.servers": s.kafka_bootstrap, "acks": "all"})
    done: list[tuple[list[tuple[tuple[str, int], int]], int]] = []
    settled = threading.Event()

    def on_done(offsets: list[tuple[tuple[str, int], int]], n: int) -> None:
        done.append((offsets, n))
        if len(done) == 2:
            settled.set()

    persister = Persister(
        lambda rows, brows: persist(engine, rows, *brows),
        DeadLetters(producer, dead_letter_topic(s)),
        on_done,
        threading.Event(),
    )
    salt = uuid.uuid4().hex[:8]
    items = [
        _pending(system, i, f"item {i}" + ("\x00" if i in (1, 4) else ""), salt) for i in range(6)
    ]
    batch = Batch(items[0].key, items, time.time(), "full")
    bad_salt = f"{salt}\x00"
    bad = [_pending(system, 10 + i, f"b {i}", bad_salt) for i in range(2)]
    bad_batch = Batch(bad[0].key, bad, time.time(), "full")
    persister.submit(
        [
            Write(
                1,
                RequestStatus.SUCCEEDED,
                items,
                batch=batch,
                outputs=[f"o{i}" for i in range(6)],
                compute=(time.time(), time.time()),
                worker_id="w",
                batch_row=True,
            ),
            Write(
                1,
                RequestStatus.SUCCEEDED,
                bad,
                batch=bad_batch,
                outputs=["x", "y"],
                compute=(time.time(), time.time()),
                worker_id="w",
                batch_row=True,
            ),
        ]
    )
    assert settled.wait(60), done
    persister.shutdown()
    assert sorted(o for offsets, _ in done for _, o in offsets) == [0, 1, 2, 3, 4, 5, 10, 11]
    with engine.connect() as conn:
        got = {
            r.request_id: r
            for r in conn.execute(
                select(requests).where(
                    requests.c.request_id.in_([p.msg.request_id for p in items + bad])
                )
            )
        }
        brows = {
            r.batch_id: r
            for r in conn.execute(
                select(batches).where(batches.c.batch_id.in_([batch.batch_id, bad_batch.batch_id]))
            )
        }
    assert len(got) == 8
    for i, p in enumerate(items):
        row = got[p.msg.request_id]
        if i in (1, 4):
            assert row.status == "failed" and row.input == f"item {i}\\u0000"
        else:
            assert row.status == "succeeded" and row.output == f"o{i}" and row.input == f"item {i}"
    assert all(got[p.msg.request_id].status == "failed" for p in bad)
    assert brows[batch.batch_id].size == 6
    assert brows[bad_batch.batch_id].batch_key == f"sim@1[salt={salt}\\u0000]"
    letters = _dead_letters(system, "direct")
    keyed = sorted(orjson.loads(v)["request_id"] for _, v in letters)
    want = [items[1], items[4], *bad]
    assert keyed == sorted(p.msg.request_id for p in want)
    assert all("could not be stored" in h["error"] for h, _ in letters)


def test_weak_durability_is_named_and_refused_unless_allowed(system: System) -> None:
    """The test services are one broker and a throwaway database: each shortfall is
    named, and a scheduler without the allowance refuses to start."""
    problems = check_durability(system.settings)
    text = "\n".join(problems)
    assert "replication factor 1, needs >= 3" in text
    assert "min.insync.replicas=1, needs >= 2" in text
    assert "synchronous_commit=off" in text and "fsync=off" in text
    assert f"{dead_letter_topic(system.settings)} has replication factor 1" in text
    system.start_scheduler(
        "strict", workers=0, models="sim", env={"GRISTMILL_ALLOW_WEAK_DURABILITY": "false"}
    )
    proc = system.procs["strict"]
    proc.wait(60)
    system.procs.pop("strict")
    assert proc.returncode not in (0, None)
    log = (system.workdir / "strict.log").read_text()
    assert "refusing to start" in log and "GRISTMILL_ALLOW_WEAK_DURABILITY=true" in log
    assert "min.insync.replicas=1" in log and "synchronous_commit=off" in log
