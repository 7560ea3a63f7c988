"""Copies to the dead-letter topic, confirmed before the offsets they cover may move.

A request the scheduler gives up on (a poison input, a row PostgreSQL refuses, a
message it cannot read) leaves its partition only once a copy of its message is in
the dead-letter topic: until the broker acknowledges the copy (acks=all), the
original's offset is not committed, so nothing is lost if the copy is.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from scheduler.core.batcher import Pending
from scheduler.runtime import metrics

log = logging.getLogger(__name__)

# The longest header value kept (an error text; the message itself is whole).
HEADER_MAX = 1000


@dataclass(frozen=True, slots=True)
class Letter:
    key: str | None
    value: bytes
    headers: dict[str, str | bytes | None] = field(default_factory=dict)


def letter_for(p: Pending, error: str) -> Letter:
    """The copy of a queued request's message, with why it was given up and where it
    was read."""
    return Letter(p.msg.request_id, p.msg.encode(), source_headers(error, p.tp, p.offset))


def source_headers(error: str, tp: tuple[str, int], offset: int) -> dict[str, str | bytes | None]:
    return {
        "error": error[:HEADER_MAX],
        "source_topic": tp[0],
        "source_partition": str(tp[1]),
        "source_offset": str(offset),
    }


class DeadLetterSink(Protocol):
    def send(self, letters: list[Letter]) -> bool:
        """True once every copy is durable; False if any is not (yet)."""
        ...


class DeadLetters:
    def __init__(self, producer: Producer, topic: str, *, timeout_s: float = 10.0):
        self.producer = producer
        self.topic = topic
        self.timeout_s = timeout_s

    def send(self, letters: list[Letter]) -> bool:
        outcomes: list[KafkaError | None] = []

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            outcomes.append(err)

        try:
            for x in letters:
                self.producer.produce(
                    self.topic,
                    key=x.key,
                    value=x.value,
                    headers=x.headers,
                    on_delivery=delivered,
                )
        except (BufferError, KafkaException) as exc:
            metrics.produce_failed("dead_letter_refused", len(letters))
            log.warning("dead-letter copy not sent: %s", exc)
            return False
        # flush serves delivery reports (ours, whichever thread polls them).
        self.producer.flush(self.timeout_s)
        failed = [e for e in outcomes if e is not None]
        if failed or len(outcomes) < len(letters):
            unconfirmed = len(letters) - len(outcomes) + len(failed)
            metrics.produce_failed("dead_letter_unconfirmed", unconfirmed)
            log.warning(
                "dead-letter copies not confirmed: %d of %d (%s)",
                len(letters) - len(outcomes) + len(failed),
                len(letters),
                failed[0] if failed else "timed out",
            )
            return False
        return True
