"""Kafka topic names and their creation.

Requests are split into one topic per priority class so that a backlog of free
traffic (or of job items) never sits in front of enterprise traffic inside one
partition: the scheduler reads every class but drains higher classes first and
can pause lower ones. See docs/decisions/0002-topics-per-priority-class.md.
"""

from __future__ import annotations

from confluent_kafka.admin import AdminClient, NewTopic

from core.config import KafkaSettings
from core.kafka import admin_config
from core.vocab import PRIORITY_CLASSES


def request_topic(settings: KafkaSettings, priority: str) -> str:
    return f"{settings.topic_prefix}.requests.{priority}"


def all_request_topics(settings: KafkaSettings) -> list[str]:
    return [request_topic(settings, p) for p in PRIORITY_CLASSES]


def dead_letter_topic(settings: KafkaSettings) -> str:
    return f"{settings.topic_prefix}.deadletter"


def ensure_topics(settings: KafkaSettings, timeout_s: float = 30.0) -> list[str]:
    """Create any missing topic; returns the names created. Safe to call from every process."""
    admin = AdminClient(admin_config(settings))
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    configs = {
        # The broker's append time is the request's "produced" timestamp in the log.
        "message.timestamp.type": "LogAppendTime",
        "min.insync.replicas": str(min(2, settings.topic_replication)),
    }
    wanted = [*all_request_topics(settings), dead_letter_topic(settings)]
    new = [
        NewTopic(
            t,
            num_partitions=settings.topic_partitions,
            replication_factor=settings.topic_replication,
            config=configs,
        )
        for t in wanted
        if t not in existing
    ]
    if not new:
        return []
    created: list[str] = []
    for name, fut in admin.create_topics(new, operation_timeout=timeout_s).items():
        try:
            fut.result()
            created.append(name)
        except Exception as exc:  # another process created it first
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    return created
