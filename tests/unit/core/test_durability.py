"""The start-up durability rules (core/durability.py) over hand-written facts."""

from __future__ import annotations

from core.config import Settings
from core.durability import (
    TopicDurability,
    checked_topics,
    kafka_problems,
    postgres_problems,
)

GOOD = TopicDurability(replication=3, min_insync=2, unclean_election=False)


def test_three_replicas_two_in_sync_and_synchronous_commits_pass() -> None:
    assert kafka_problems({"gm.requests.paid": GOOD}) == []
    for sync in ("on", "remote_write", "remote_apply"):
        assert postgres_problems({"synchronous_commit": sync, "fsync": "on"}) == []


def test_each_shortfall_names_its_topic_and_setting() -> None:
    problems = kafka_problems(
        {
            "gm.requests.paid": TopicDurability(1, 1, False),
            "gm.requests.free": TopicDurability(3, 1, True),
            "gm.deadletter": None,
        }
    )
    assert problems == [
        "Kafka topic gm.requests.paid has replication factor 1, needs >= 3 "
        "(GRISTMILL_TOPIC_REPLICATION when topics are created; kafka-reassign-partitions "
        "for existing ones)",
        "Kafka topic gm.requests.paid has min.insync.replicas=1, needs >= 2",
        "Kafka topic gm.requests.free has min.insync.replicas=1, needs >= 2",
        "Kafka topic gm.requests.free has unclean.leader.election.enable=true",
        "Kafka topic gm.deadletter does not exist",
    ]


def test_asynchronous_or_unflushed_commits_are_refused() -> None:
    for sync in ("off", "local"):
        (p,) = postgres_problems({"synchronous_commit": sync, "fsync": "on"})
        assert f"synchronous_commit={sync}" in p
    assert postgres_problems({"synchronous_commit": "on", "fsync": "off"}) == [
        "PostgreSQL fsync=off, needs on"
    ]


def test_the_request_topics_and_the_dead_letter_topic_are_checked() -> None:
    names = checked_topics(Settings(topic_prefix="gm"))
    assert names == [
        "gm.requests.enterprise",
        "gm.requests.paid",
        "gm.requests.free",
        "gm.requests.jobs",
        "gm.deadletter",
    ]


def test_weak_durability_is_refused_unless_allowed() -> None:
    assert Settings().allow_weak_durability is False
    assert Settings(allow_weak_durability=True).allow_weak_durability is True
