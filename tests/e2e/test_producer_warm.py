"""The API's producer learns the request topics before its first request
(ingest/acceptance/producer.py ``warm``): on a real broker it is quick and the first
message then goes out; with no broker it gives up within its timeout, without raising,
so an API process still starts (and answers 503 until Kafka is back)."""

from __future__ import annotations

import asyncio
import time
import uuid

from core.config import Settings
from core.topics import all_request_topics, ensure_topics
from gristmill.devservices.ports import free_port
from gristmill.devservices.stack import Services
from ingest.acceptance.producer import AsyncProducer


def test_warm_learns_the_topics_and_the_first_message_goes_out(services: Services) -> None:
    settings = Settings(
        kafka_bootstrap=services.bootstrap, topic_prefix=f"gm-warm-{uuid.uuid4().hex[:6]}"
    )
    ensure_topics(settings, timeout_s=30)
    producer = AsyncProducer(settings, timeout_ms=10_000)
    try:
        started = time.monotonic()
        producer.warm(all_request_topics(settings), 5.0)
        assert time.monotonic() - started < 5.0
        topic = all_request_topics(settings)[0]
        partition, offset = asyncio.run(producer.produce(topic, b"{}"))
        assert partition >= 0 and offset >= 0
    finally:
        producer.close()


def test_without_a_broker_warm_gives_up_in_its_time_and_does_not_raise() -> None:
    settings = Settings(kafka_bootstrap=f"127.0.0.1:{free_port()}")
    producer = AsyncProducer(settings, timeout_ms=2_000)
    try:
        started = time.monotonic()
        producer.warm(all_request_topics(settings), 1.0)
        assert time.monotonic() - started < 3.0  # the first topic's timeout, then it stops
    finally:
        producer.close()
