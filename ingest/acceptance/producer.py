"""An asyncio face on the idempotent Kafka producer.

``produce`` returns only once the broker has the message with acks=all: that is
the moment a request becomes durable and may be acknowledged. A background
thread serves the producer's delivery callbacks and hands each poll's worth of
outcomes to the event loop in one call (one wake-up of the loop per poll, not one
per message: at 1,000 requests/s that is most of what the thread costs).

A broker dying is routine (acks=all with min.insync.replicas 2 keeps going on
two of three brokers; librdkafka retries until the new leader answers, within
``message.timeout.ms``). A *fatal* error of the idempotent producer, however,
leaves the client unusable for good, so the producer is then replaced by a new
one: the API recovers by itself instead of answering 503 until restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from core.config import KafkaSettings
from core.errors import Unavailable
from core.kafka import KafkaHeaders, producer_config
from ingest import metrics

log = logging.getLogger(__name__)


class AsyncProducer:
    def __init__(self, kafka: KafkaSettings, *, timeout_ms: int):
        self._config = producer_config(
            kafka,
            **{
                "linger.ms": 5,  # a few ms of batching halves the broker work per request
                "message.timeout.ms": timeout_ms,
                "compression.type": "lz4",
                # Connected to every broker from the start, not on the first message
                # for each (see ``warm``).
                "enable.sparse.connections": False,
                "error_cb": self._on_error,
            },
        )
        self._fatal = threading.Event()
        # Outcomes served by the current poll, handed to their loops after it returns.
        self._delivered: deque[_Outcome] = deque()  # appended by callbacks, any thread
        self._producer = Producer(self._config)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="kafka-producer", daemon=True)
        self._thread.start()

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            log.error("Kafka producer hit a fatal error (%s); replacing it", err.str())
            self._fatal.set()
        else:  # transient (a broker down, a leader moving): librdkafka retries by itself
            log.info("Kafka producer: %s", err.str())

    def _replace(self) -> None:
        old, self._producer = self._producer, Producer(self._config)
        self._fatal.clear()
        old.purge()  # waiting callers get their failure (503) now, not at the timeout
        old.poll(0)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)
            self._hand_over()
            if self._fatal.is_set():
                self._replace()
                self._hand_over()
        self._hand_over()  # what close()'s flush delivered

    def _hand_over(self) -> None:
        """Settle the futures the last poll's callbacks decided, one call per loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
        while self._delivered:
            outcome = self._delivered.popleft()
            by_loop.setdefault(outcome[0], []).append(outcome)
        for loop, outcomes in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, outcomes)

    async def produce(
        self, topic: str, value: bytes, headers: KafkaHeaders | None = None
    ) -> tuple[int, int]:
        """(partition, offset) of the durable message; raises Unavailable otherwise.

        Messages carry no key: nothing downstream needs a request's partition (its id is
        in the value, its row is unique by id), and keyless messages let librdkafka's
        sticky partitioner put a whole linger window into one partition. librdkafka
        sends one ProduceRequest per partition, so keyed by request id a window spread
        over 6 partitions took up to 6 requests, each costing the broker and the
        consumer's fetches (Kafka CPU per request -12% at 1,000 requests/s)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[int, int]] = loop.create_future()
        started = time.monotonic()

        def done(err: KafkaError | None, msg: Message) -> None:
            # Runs in the poll thread, inside poll(): recorded, settled after it returns.
            if err is not None:
                metrics.produce_failed(err.name())
                self._delivered.append(
                    (
                        loop,
                        fut,
                        Unavailable(
                            f"could not make the request durable in Kafka: {err.str()}",
                            retry_after_s=2,
                            reason="kafka",
                        ),
                    )
                )
            else:
                self._delivered.append((loop, fut, (msg.partition() or 0, msg.offset() or 0)))

        try:
            self._producer.produce(topic, value=value, headers=headers, on_delivery=done)
        except BufferError as exc:
            metrics.produce_failed("buffer_full")
            raise Unavailable(
                "ingest queue to Kafka is full", retry_after_s=1, reason="kafka"
            ) from exc
        except KafkaException as exc:
            metrics.produce_failed(exc.args[0].name() if exc.args else "refused")
            raise Unavailable(
                f"Kafka refused the request: {exc}", retry_after_s=2, reason="kafka"
            ) from exc
        out = await fut
        metrics.produced(time.monotonic() - started)
        return out

    def warm(self, topics: list[str], timeout_s: float) -> None:
        """Learn ``topics``' partitions and leaders before the first request: a fresh
        process otherwise pays for that on its first messages (blocking, in a thread)."""
        for topic in topics:
            try:
                self._producer.list_topics(topic=topic, timeout=timeout_s)
            except KafkaException as exc:  # Kafka not there yet: the first message learns
                log.info("Kafka metadata for %s not read at start: %s", topic, exc)
                return

    def close(self) -> None:
        self._producer.flush(5)
        self._stop.set()
        self._thread.join(timeout=2)


# (the waiting caller's loop, its future, (partition, offset) or the error to raise)
_Outcome = tuple[
    asyncio.AbstractEventLoop, asyncio.Future[tuple[int, int]], tuple[int, int] | Exception
]


def _settle(outcomes: list[_Outcome]) -> None:
    for _, fut, value in outcomes:
        if fut.done():
            continue
        if isinstance(value, Exception):
            fut.set_exception(value)
        else:
            fut.set_result(value)
