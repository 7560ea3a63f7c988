"""Making a job durable: validate every item, record it, then put it in Kafka.

Submission has two phases so that a crash at any point leaves either no job or
a complete one that runs:

1. Items are parsed and validated as they stream in and COPYed into
   ``job_items`` inside one transaction; the ``jobs`` row is inserted last, in
   the same transaction. An invalid item rolls everything back (nothing
   half-created stays behind); a crash before the commit leaves nothing.
2. After the commit the job is ``submitting``: its items are read back and
   produced to Kafka, then it is marked ``submitted`` and the client gets 202.
   A crash here leaves a ``submitting`` job whose heartbeat goes stale; any API
   instance then finishes phase 2 (request ids are deterministic, so items
   produced twice still yield one result row each).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import psycopg
from confluent_kafka import KafkaError, Message, Producer
from psycopg.types.json import Jsonb

from core.config import Settings
from core.errors import IdempotencyConflict, InvalidInput, PayloadTooLarge, Unavailable
from core.kafka import producer_config
from core.messages import RequestMessage, job_item_request_id
from core.models.spec import ModelSpec
from core.topics import request_topic
from results.db import libpq_url

log = logging.getLogger("gristmill.ingest.jobs")

MAX_CUSTOM_ID = 255
_COPY_CHUNK = 5_000


@dataclass
class JobRequest:
    tenant_id: str
    spec: ModelSpec
    params: dict[str, Any]
    completion_window_s: int
    webhook_url: str | None = None
    metadata: dict[str, Any] | None = None
    idempotency_key: str | None = None
    job_id: str = field(default_factory=lambda: str(uuid.uuid4()))


@dataclass
class Recorded:
    job_id: str
    created: bool  # False: an earlier submission with the same key and body
    webhook_secret: str | None = None


def parse_item(obj: Any, where: str, spec: ModelSpec) -> tuple[str | None, Any]:
    """One item, ``{"custom_id"?: str, "input": ...}``; errors name ``where`` (index/line)."""
    if not isinstance(obj, dict):
        raise InvalidInput(f"{where}: each item must be a JSON object", field=where)
    unknown = sorted(set(obj) - {"custom_id", "input"})
    if unknown:
        raise InvalidInput(f"{where}: unknown field {unknown[0]!r}", field=f"{where}.{unknown[0]}")
    if "input" not in obj:
        raise InvalidInput(f"{where}: field 'input' is required", field=f"{where}.input")
    custom_id = obj.get("custom_id")
    if custom_id is not None and (not isinstance(custom_id, str) or len(custom_id) > MAX_CUSTOM_ID):
        raise InvalidInput(
            f"{where}: custom_id must be a string of at most {MAX_CUSTOM_ID} characters",
            field=f"{where}.custom_id",
        )
    try:
        spec.validate_input(obj["input"])
    except InvalidInput as exc:
        raise InvalidInput(f"{where}: {exc.message}", field=f"{where}.input") from exc
    return custom_id, obj["input"]


async def jsonl_items(
    chunks: AsyncIterator[bytes], spec: ModelSpec, settings: Settings, hasher: Any
) -> AsyncIterator[tuple[str | None, Any]]:
    """Items of a JSONL upload, parsed as the bytes arrive (memory stays bounded)."""
    buf = b""
    line_no = 0
    size = 0
    count = 0

    def one(line: bytes) -> tuple[str | None, Any] | None:
        nonlocal count
        if not line.strip():
            return None
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise InvalidInput(
                f"line {line_no}: not valid JSON ({exc})", field=f"line {line_no}"
            ) from exc
        count += 1
        if count > settings.max_job_items:
            raise PayloadTooLarge(f"a job may hold at most {settings.max_job_items} items")
        return parse_item(obj, f"line {line_no}", spec)

    async for chunk in chunks:
        size += len(chunk)
        if size > settings.max_job_bytes:
            raise PayloadTooLarge(f"job upload exceeds {settings.max_job_bytes} bytes")
        hasher.update(chunk)
        buf += chunk
        lines = buf.split(b"\n")
        buf = lines.pop()
        for line in lines:
            line_no += 1
            item = one(line)
            if item is not None:
                yield item
    if buf:
        line_no += 1
        item = one(buf)
        if item is not None:
            yield item


async def record_job(
    settings: Settings,
    job: JobRequest,
    items: AsyncIterator[tuple[str | None, Any]],
    body_hash: Callable[[], str],
) -> Recorded:
    """Phase 1: every item and then the job row, in one transaction."""
    secret = ("whsec_" + secrets.token_urlsafe(24)) if job.webhook_url else None
    try:
        conn = await psycopg.AsyncConnection.connect(libpq_url(settings.database_url))
    except psycopg.OperationalError as exc:
        raise Unavailable("the database is unavailable", retry_after_s=2) from exc
    async with conn, conn.transaction() as tx:
        total = 0
        async with conn.cursor().copy(
            "COPY job_items (job_id, item_index, custom_id, input, request_id) FROM STDIN"
        ) as copy:
            async for custom_id, value in items:
                await copy.write_row(
                    (
                        job.job_id,
                        total,
                        custom_id,
                        orjson.dumps(value).decode(),
                        job_item_request_id(job.job_id, total),
                    )
                )
                total += 1
        if total == 0:
            raise InvalidInput("a job needs at least one item", field="items")
        now = datetime.now(UTC)
        cur = await conn.execute(
            """INSERT INTO jobs (job_id, tenant_id, model, model_version, params, metadata,
                       total_items, expires_at, idempotency_key, body_hash, webhook_url,
                       webhook_secret)
                   VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
                   ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING job_id""",
            (
                job.job_id,
                job.tenant_id,
                job.spec.name,
                job.spec.version,
                Jsonb(job.params),
                Jsonb(job.metadata) if job.metadata is not None else None,
                total,
                now + timedelta(seconds=job.completion_window_s),
                job.idempotency_key,
                body_hash(),
                job.webhook_url,
                secret,
            ),
        )
        if await cur.fetchone() is not None:
            return Recorded(job.job_id, True, secret)
        # The key was used before: same body is the same job, another body is a 422.
        prev = await (
            await conn.execute(
                "SELECT job_id, body_hash FROM jobs WHERE tenant_id = %s AND idempotency_key = %s",
                (job.tenant_id, job.idempotency_key),
            )
        ).fetchone()
        raise psycopg.Rollback(tx)  # drop the items we just copied
    assert prev is not None
    if prev[1] != body_hash():
        raise IdempotencyConflict(
            "Idempotency-Key was already used with a different job", field="Idempotency-Key"
        )
    return Recorded(str(prev[0]), False)


class JobPublisher:
    """Phase 2: produce a recorded job's items to Kafka, then mark it submitted."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.dsn = libpq_url(settings.database_url)
        self._producer = Producer(
            producer_config(
                settings,
                **{
                    "linger.ms": 20,  # throughput over latency: these are bulk items
                    "batch.size": 1_000_000,
                    "compression.type": "lz4",
                    "queue.buffering.max.messages": 500_000,
                    "message.timeout.ms": 60_000,
                },
            )
        )
        self._lock = threading.Lock()  # one publish at a time shares the producer cleanly

    def publish(self, job_id: str, *, progress: Callable[[int], None] | None = None) -> int:
        """Produce every item whose current attempt has no result yet (all of them for a
        new job; the unfinished ones after a crash or a retry). Blocking: run it in a
        thread. Returns how many items were produced."""
        errors: list[str] = []

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                errors.append(err.str())

        topic = request_topic(self.settings, "jobs")
        sent = 0
        with self._lock, psycopg.connect(self.dsn, autocommit=True) as conn:
            job = conn.execute(
                "SELECT j.tenant_id, j.model, j.model_version, j.params, j.created_at, "
                "j.expires_at, t.weight FROM jobs j JOIN tenants t ON t.id = j.tenant_id "
                "WHERE j.job_id = %s",
                (job_id,),
            ).fetchone()
            if job is None:
                return 0
            tenant_id, model, version, params, created_at, expires_at, weight = job
            beat = time.monotonic()
            with conn.transaction(), conn.cursor(name=f"publish-{job_id}") as cur:
                cur.itersize = _COPY_CHUNK
                cur.execute(
                    "SELECT i.item_index, i.input, i.request_id, i.attempt FROM job_items i "
                    "WHERE i.job_id = %s AND NOT EXISTS (SELECT 1 FROM requests r "
                    "WHERE r.request_id = i.request_id) ORDER BY i.item_index",
                    (job_id,),
                )
                for index, value, request_id, job_attempt in cur:
                    msg = RequestMessage(
                        request_id=str(request_id),
                        tenant_id=str(tenant_id),
                        priority="jobs",
                        model=model,
                        version=version,
                        input=value,
                        params=params,
                        deadline=expires_at.timestamp(),
                        received_at=created_at.timestamp(),
                        job_id=job_id,
                        item_index=index,
                        job_attempt=job_attempt,
                        weight=weight,
                    )
                    while True:
                        try:
                            self._producer.produce(
                                topic,
                                value=msg.encode(),
                                key=str(request_id),
                                on_delivery=on_delivery,
                            )
                            break
                        except BufferError:
                            self._producer.poll(0.05)
                    sent += 1
                    if sent % 1000 == 0:
                        self._producer.poll(0)
                        if progress:
                            progress(sent)
                        if time.monotonic() - beat > 2:
                            beat = time.monotonic()
                            self._heartbeat(job_id)
            remaining = self._producer.flush(120)
            if remaining or errors:
                raise Unavailable(
                    f"could not make {remaining or len(errors)} job items durable in Kafka: "
                    f"{errors[:1]}",
                    retry_after_s=5,
                )
            conn.execute("UPDATE jobs SET submit_state = 'submitted' WHERE job_id = %s", (job_id,))
        return sent

    def _heartbeat(self, job_id: str) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("UPDATE jobs SET submit_heartbeat_at = now() WHERE job_id = %s", (job_id,))

    def claim_stale(self) -> str | None:
        """A job some API instance left 'submitting' (it died): take it over."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(
                """UPDATE jobs SET submit_heartbeat_at = now()
                   WHERE job_id = (SELECT job_id FROM jobs WHERE submit_state = 'submitting'
                                     AND submit_heartbeat_at < now() - make_interval(secs => %s)
                                   ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED)
                   RETURNING job_id""",
                (self.settings.submit_stale_s,),
            ).fetchone()
        return str(row[0]) if row else None

    def close(self) -> None:
        self._producer.flush(10)


def body_hasher() -> Any:
    return hashlib.sha256()
