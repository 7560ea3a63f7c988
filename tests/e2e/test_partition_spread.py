"""Each sync topic's partitions spread evenly over the schedulers whatever order they
join in, so a host whose traffic is all in one tier still uses every scheduler
(scheduler/runtime/lane.py ``lane_specs``: a consumer per class, one group)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from core.kafka import admin_config
from core.models.sim import sim_output
from core.topics import request_topic
from gristmill.devservices.stack import Services, System, build_system

SCHEDULERS = 3
PARTITIONS = 6


@pytest.fixture(scope="module")
def three(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    workdir: Path = tmp_path_factory.mktemp("spread")
    system = build_system(
        services,
        workdir,
        sim_batch_ms=20,
        extra_env={"GRISTMILL_TOPIC_PARTITIONS": str(PARTITIONS)},
    )
    try:
        # Staggered joins: two schedulers settle the group, the third comes later (the
        # order that gave one scheduler all six enterprise partitions before).
        system.start_scheduler("s0", workers=1, models="sim")
        system.start_scheduler("s1", workers=1, models="sim")
        system.url = system.start_api()
        system.wait_until_serving("sim")
        time.sleep(3)
        system.start_scheduler("s2", workers=1, models="sim")
        yield system
    finally:
        system.close()


def _assignment(system: System) -> dict[str, Counter[str]]:
    """topic -> scheduler process -> partitions it holds, from the group's description."""
    s = system.settings
    admin = AdminClient(admin_config(s))
    (desc,) = admin.describe_consumer_groups([s.consumer_group]).values()
    group = desc.result(timeout=10)
    held: dict[str, Counter[str]] = {}
    for m in group.members:
        scheduler = m.client_id.split("-", 3)[-1]  # gristmill-scheduler-<lane>-<id>
        for tp in m.assignment.topic_partitions:
            held.setdefault(tp.topic, Counter())[scheduler] += 1
    return held


def _settled(system: System, timeout_s: float = 60) -> dict[str, Counter[str]]:
    deadline = time.monotonic() + timeout_s
    while True:
        held = _assignment(system)
        even = all(
            len(c) == SCHEDULERS and set(c.values()) == {PARTITIONS // SCHEDULERS}
            for c in held.values()
        )
        if (even and len(held) == 3) or time.monotonic() > deadline:
            return held
        time.sleep(1)


def test_every_sync_topic_is_split_evenly_over_staggered_schedulers(three: System) -> None:
    held = _settled(three)
    for cls in ("enterprise", "paid", "free"):
        counts = held[request_topic(three.settings, cls)]
        assert sorted(counts.values()) == [2, 2, 2], (cls, held)
    # The three lanes of one scheduler are one process: the same three ids in every topic.
    assert len({frozenset(c) for c in held.values()}) == 1


def test_all_traffic_in_one_tier_reaches_every_scheduler(three: System) -> None:
    _settled(three)
    texts = [f"one tier {i}" for i in range(240)]
    with httpx.Client(timeout=30) as client:
        for t in texts:
            r = client.post(
                f"{three.url}/v1/infer",
                headers=three.headers("enterprise"),
                json={"model": "sim", "input": t},
            )
            assert r.status_code == 200, r.text
            assert r.json()["output"] == sim_output(t)
    # Every enterprise partition got some of it and was consumed to its end: with the
    # even split above, each scheduler served part of the one tier.
    s = three.settings
    topic = request_topic(s, "enterprise")
    c = Consumer({"bootstrap.servers": s.kafka_bootstrap, "group.id": s.consumer_group})
    try:
        deadline = time.monotonic() + 30
        while True:
            tps = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
            ends = [c.get_watermark_offsets(tp, timeout=10)[1] for tp in tps]
            done = [max(tp.offset, 0) for tp in tps]
            if done == ends or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        c.close()
    assert all(e > 0 for e in ends), ends
    assert done == ends
