"""An asyncio face on the idempotent Kafka producer.

``produce`` returns only once the broker has the message with acks=all: that is
the moment a request becomes durable and may be acknowledged. A background
thread serves the producer's delivery callbacks.

A broker dying is routine (acks=all with min.insync.replicas 2 keeps going on
two of three brokers; librdkafka retries until the new leader answers, within
``message.timeout.ms``). A *fatal* error of the idempotent producer, however,
leaves the client unusable for good, so the producer is then replaced by a new
one: the API recovers by itself instead of answering 503 until restarted.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from gristmill.errors import Unavailable

log = logging.getLogger("gristmill.ingest.producer")


class AsyncProducer:
    def __init__(self, bootstrap: str, *, timeout_ms: int):
        self._config = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,  # no duplicates or reordering from producer retries
            "acks": "all",
            "linger.ms": 5,  # a few ms of batching halves the broker work per request
            "message.timeout.ms": timeout_ms,
            "compression.type": "lz4",
            "error_cb": self._on_error,
        }
        self._fatal = threading.Event()
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
            if self._fatal.is_set():
                self._replace()

    async def produce(self, topic: str, key: str, value: bytes) -> tuple[int, int]:
        """(partition, offset) of the durable message; raises Unavailable otherwise."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[int, int]] = loop.create_future()

        def done(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                loop.call_soon_threadsafe(
                    _set_exc,
                    fut,
                    Unavailable(
                        f"could not make the request durable in Kafka: {err.str()}", retry_after_s=2
                    ),
                )
            else:
                loop.call_soon_threadsafe(
                    _set_result, fut, (msg.partition() or 0, msg.offset() or 0)
                )

        try:
            self._producer.produce(topic, value=value, key=key, on_delivery=done)
        except BufferError as exc:
            raise Unavailable("ingest queue to Kafka is full", retry_after_s=1) from exc
        except KafkaException as exc:
            raise Unavailable(f"Kafka refused the request: {exc}", retry_after_s=2) from exc
        return await fut

    def close(self) -> None:
        self._producer.flush(5)
        self._stop.set()
        self._thread.join(timeout=2)


def _set_result(fut: asyncio.Future[tuple[int, int]], value: tuple[int, int]) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exc(fut: asyncio.Future[tuple[int, int]], exc: Exception) -> None:
    if not fut.done():
        fut.set_exception(exc)
