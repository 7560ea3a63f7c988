"""Making a job durable: stage and validate every item, record the job, then put it
in Kafka (decisions 10 and 26).

1. The body is read at the client's pace into a temp file, each item validated as
   it arrives (ingest/job_upload.py); no database connection is held meanwhile.
2. One transaction COPYs the staged items into ``job_items``, charges the tenant's
   job-item budget and inserts the ``jobs`` row last: a crash or a refusal leaves
   nothing; a committed job is complete.
3. The job is ``submitting`` until its items are produced to Kafka; then it is
   ``submitted`` and the client gets 202. A crash here leaves a ``submitting`` job
   whose heartbeat goes stale; any API instance then finishes it (request ids are
   deterministic, so items produced twice still yield one result row each).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson
from confluent_kafka import KafkaError, Message, Producer

from core.config import Settings
from core.errors import IdempotencyConflict, InvalidInput, PayloadTooLarge, Unavailable
from core.kafka import producer_config
from core.limits import check_object
from core.messages import RequestMessage
from core.models.spec import ModelSpec
from core.topics import request_topic
from ingest import job_quota
from ingest.destinations import AllowList, check_addresses, parse_destination
from ingest.job_pacing import PUBLISH_SLICE, Pacer
from ingest.job_schemas import JobBody, JobOptions, check_metadata, validate
from ingest.job_upload import Item, ItemStager, Staged, body_chunks
from ingest.webhook_client import NotResolved, resolve
from ingest.webhook_events import new_secret
from results.db import make_engine
from results.job_items import copy_items, unsent_page
from results.job_submission import (
    NewJob,
    claim_stale,
    forget_expired_key,
    heartbeat,
    insert_job,
    job_for_key,
    job_to_publish,
    mark_submitted,
)
from results.tenants import Tenant

if TYPE_CHECKING:
    from ingest.state import AppState

log = logging.getLogger("gristmill.ingest.jobs")

_FIRST_PAGE_ROWS = 100  # item rows read for Kafka in the first page of a publish
_PAGE_BYTES = 4 << 20  # later pages are sized to about this many bytes of messages
_QUEUE_KIB = 16 << 10  # 16 MiB: a local broker keeps up with far less in flight
_HEARTBEAT_S = 2.0  # a publishing job's heartbeat, well inside submit_stale_s
# How long the items produced by one publish may take to be acknowledged by Kafka.
_PUBLISH_ACK_S = 120.0


@dataclass
class Submission:
    """A validated job whose items are staged; nothing is written yet."""

    tenant: Tenant
    spec: ModelSpec
    params: dict[str, Any]
    window_s: int
    webhook_url: str | None
    metadata: dict[str, str] | None
    idempotency_key: str | None
    staged: Staged
    job_id: str = field(default_factory=lambda: str(uuid.uuid4()))


@dataclass(frozen=True)
class Recorded:
    job_id: str
    created: bool  # False: an earlier submission with the same key and body
    webhook_secret: str | None = None


@dataclass(frozen=True)
class Options:
    """A job's options, checked: everything but its items."""

    spec: ModelSpec
    params: dict[str, Any]
    window_s: int
    webhook_url: str | None


async def check_options(st: AppState, opts: JobOptions) -> Options:
    """The model, params, window and webhook destination, or the 4xx naming the field."""
    s = st.settings
    # A job's items may wait in Kafka for a version no worker serves yet (loading).
    spec = await st.catalog.resolve(opts.model, wait_for_workers=True)
    if opts.params is not None:  # as /v1/infer's (ingest/schemas.py): storable, capped
        check_object(
            opts.params, "params", max_bytes=s.max_params_bytes, max_depth=s.max_json_depth
        )
    params = spec.normalize_params(opts.params)
    window = (
        s.default_completion_window_s
        if opts.completion_window_s is None
        else (opts.completion_window_s)
    )
    if not 0 < window <= s.max_completion_window_s:
        raise InvalidInput(
            f"completion_window_s must be 1..{s.max_completion_window_s}",
            field="completion_window_s",
        )
    if opts.webhook_url is not None:
        await check_webhook(s, opts.webhook_url)
    return Options(spec, params, window, opts.webhook_url)


async def check_webhook(settings: Settings, url: str) -> None:
    """400 unless the URL is well formed and resolves only to addresses webhooks may
    reach (checked again at every delivery: ingest/webhook_client.py)."""
    dest = parse_destination(url)
    try:
        async with asyncio.timeout(settings.webhook_timeout_s):
            addresses = await resolve(dest.host, dest.port)
    except (NotResolved, TimeoutError):
        addresses = []
    check_addresses(dest, addresses, AllowList.parse(settings.webhook_allow_networks))


def _stager(st: AppState, spec: ModelSpec, job_id: str) -> ItemStager:
    s = st.settings
    return ItemStager(
        job_id,
        spec,
        max_items=s.max_job_items,
        max_line=s.max_body_bytes,
        max_depth=s.max_json_depth,
        folder=s.upload_dir,
    )


async def stage_json(
    st: AppState, tenant: Tenant, stream: AsyncIterator[bytes], key: str | None
) -> Submission:
    """A JSON job body: read (capped as it arrives), parsed, every item staged."""
    s = st.settings
    raw = b"".join(
        [
            c
            async for c in body_chunks(
                stream,
                idle_timeout_s=s.upload_idle_timeout_s,
                max_bytes=s.max_job_json_bytes,
                what="a JSON job body (upload large jobs as JSONL, application/x-ndjson)",
                min_rate_bps=s.upload_min_bytes_per_s,
            )
        ]
    )
    if not raw.strip():
        raise InvalidInput("request body is empty; expected a JSON object")
    try:
        data = await asyncio.to_thread(orjson.loads, raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}") from exc
    body = validate(data, JobBody)
    if len(body.items) > s.max_job_json_items:
        raise PayloadTooLarge(
            f"a JSON job may hold at most {s.max_job_json_items} items; upload larger "
            "jobs as JSONL (application/x-ndjson)"
        )
    check_metadata(body.metadata)
    opts = await check_options(st, body)
    job_id = str(uuid.uuid4())
    stager = _stager(st, opts.spec, job_id)
    stager.hasher.update(raw)

    def stage_all() -> Staged:
        for i, obj in enumerate(body.items):
            stager.add_object(obj, f"items[{i}]")
        return stager.finish()

    try:
        staged = await asyncio.to_thread(stage_all)
    except BaseException:
        stager.close()
        raise
    return Submission(
        tenant,
        opts.spec,
        opts.params,
        opts.window_s,
        opts.webhook_url,
        body.metadata,
        key,
        staged,
        job_id,
    )


async def stage_jsonl(
    st: AppState,
    tenant: Tenant,
    stream: AsyncIterator[bytes],
    opts_in: JobOptions,
    key: str | None,
) -> Submission:
    """A JSONL upload: options from the query, then one item per line, staged as the
    lines arrive."""
    s = st.settings
    opts = await check_options(st, opts_in)
    job_id = str(uuid.uuid4())
    stager = _stager(st, opts.spec, job_id)
    stager.hasher.update(
        orjson.dumps(
            [opts_in.model, opts_in.params, opts_in.completion_window_s, opts_in.webhook_url]
        )
    )
    try:
        async for chunk in body_chunks(
            stream,
            idle_timeout_s=s.upload_idle_timeout_s,
            max_bytes=s.max_job_bytes,
            what="a job upload",
            min_rate_bps=s.upload_min_bytes_per_s,
        ):
            t0 = time.monotonic()
            await asyncio.to_thread(stager.feed, chunk)
            if st.jobs.pacer is not None:  # staging gives way too (ingest/job_pacing.py)
                await asyncio.sleep(st.jobs.pacer.after(time.monotonic() - t0))
        staged = await asyncio.to_thread(stager.finish)
    except BaseException:
        stager.close()
        raise
    return Submission(
        tenant, opts.spec, opts.params, opts.window_s, opts.webhook_url, None, key, staged, job_id
    )


class _KeyTaken(Exception):
    """A concurrent submission recorded a job with the same Idempotency-Key first."""


def _replay(prev: Any, sub: Submission) -> Recorded:
    if prev.body_hash != sub.staged.body_hash:
        raise IdempotencyConflict(
            "Idempotency-Key was already used with a different job", field="Idempotency-Key"
        )
    return Recorded(str(prev.job_id), False)


async def record_job(st: AppState, sub: Submission) -> Recorded:
    """Phase 1: the staged items, the budget charge and the job row, in one transaction."""
    s = st.settings
    tenant, key = sub.tenant, sub.idempotency_key
    secret = new_secret() if sub.webhook_url else None
    try:
        async with st.engine.begin() as conn:
            if key is not None:
                await forget_expired_key(conn, tenant.id, key, s.idempotency_ttl_h)
                prev = await job_for_key(conn, tenant.id, key)
                if prev is not None:
                    return _replay(prev, sub)
            await copy_items(conn, sub.staged.file)
            # Charged after the COPY: the budget's row lock lasts only until the commit.
            await job_quota.charge(conn, s, tenant, sub.staged.count)
            created = await insert_job(
                conn,
                NewJob(
                    job_id=sub.job_id,
                    tenant_id=tenant.id,
                    model=sub.spec.name,
                    model_version=sub.spec.version,
                    params=sub.params,
                    metadata=sub.metadata,
                    total_items=sub.staged.count,
                    expires_at=datetime.now(UTC) + timedelta(seconds=sub.window_s),
                    idempotency_key=key,
                    body_hash=sub.staged.body_hash,
                    webhook_url=sub.webhook_url,
                    webhook_secret=secret,
                ),
            )
            if not created:
                raise _KeyTaken  # rolls back our items and our charge
    except _KeyTaken:
        assert key is not None
        async with st.engine.connect() as conn:
            prev = await job_for_key(conn, tenant.id, key)
        if prev is None:  # the other submission's key expired meanwhile: very unlikely
            raise Unavailable(
                "a concurrent submission holds this key; retry", retry_after_s=1
            ) from None
        return _replay(prev, sub)
    return Recorded(sub.job_id, True, secret)


class _Deliveries:
    """Kafka acknowledgements of one publish. Callbacks may run in any thread that
    polls the shared producer, so the counts are guarded."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pending = 0
        self.errors: list[str] = []

    def sent(self, n: int) -> None:
        """``n`` messages are about to be produced (counted first: another thread's poll
        may serve their acknowledgements before the last of them is produced)."""
        with self._lock:
            self.pending += n

    def on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        with self._lock:
            self.pending -= 1
            if err is not None:
                self.errors.append(err.str())


class JobPublisher:
    """Phase 2: produce a recorded job's items to Kafka, then mark it submitted.

    Publishes run concurrently in a thread pool of their own, sharing one producer
    (thread-safe) and a small PostgreSQL pool; each waits only for its own messages'
    acknowledgements, so a million-item job never holds up a small one."""

    def __init__(self, settings: Settings, pacer: Pacer | None = None):
        self.settings = settings
        # Publishing gives way to the instance's sync requests (ingest/job_pacing.py).
        self.pacer = pacer
        workers = settings.max_uploads + 2  # uploads' publishes, a retry, the stale finisher
        self.engine = make_engine(settings.database_url, pool_size=workers)
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="job-publish")
        self._producer = Producer(
            producer_config(
                settings,
                **{
                    "linger.ms": 20,  # throughput over latency: these are bulk items
                    "batch.size": 1_000_000,
                    "compression.type": "lz4",
                    "queue.buffering.max.messages": 500_000,
                    # Messages waiting for the broker, all publishes together (KiB): the
                    # publisher's memory is bounded whatever the jobs' size.
                    "queue.buffering.max.kbytes": _QUEUE_KIB,
                    "message.timeout.ms": 60_000,
                },
            )
        )

    async def publish(self, job_id: str, staged: Staged | None = None) -> int:
        """``staged``: the new job's staged file, read instead of its rows."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, lambda: self.publish_sync(job_id, staged=staged)
        )

    async def claim_stale(self) -> str | None:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._executor, claim_stale, self.engine, self.settings.submit_stale_s
        )

    def publish_sync(
        self,
        job_id: str,
        *,
        progress: Callable[[int], None] | None = None,
        staged: Staged | None = None,
    ) -> int:
        """Produce every item whose current attempt has no result yet (all of them for a
        new job; the unfinished ones after a crash or a retry). A new job's items come
        from its staged file when given (the same rows the COPY wrote, none of them sent
        yet), else from PostgreSQL. Blocking. Returns how many items were produced."""
        topic = request_topic(self.settings, "jobs")
        acks = _Deliveries()
        sent = 0
        with self.engine.connect() as conn:
            job = job_to_publish(conn, job_id)
        if job is None:
            return 0
        # The same for every item (a million of them: worked out once).
        tenant_id = str(job.tenant_id)
        deadline, received_at = job.expires_at.timestamp(), job.created_at.timestamp()
        beat = sliced = time.monotonic()
        sizes: list[int] = []  # bytes of messages in the page just sent: sizes the next
        pages = (
            staged.pages(_PAGE_BYTES)
            if staged
            else self._unsent_pages(job_id, int(job.total_items), sizes)
        )
        for page in pages:
            page_bytes = 0
            acks.sent(len(page))
            for index, value, request_id, job_attempt in page:
                if self.pacer is not None and sent % PUBLISH_SLICE == PUBLISH_SLICE - 1:
                    now = time.monotonic()
                    time.sleep(self.pacer.after(now - sliced))  # no GIL held meanwhile
                    sliced = time.monotonic()
                msg = RequestMessage(
                    request_id=request_id,
                    tenant_id=tenant_id,
                    priority="jobs",
                    model=job.model,
                    version=job.model_version,
                    input=orjson.Fragment(value),  # already JSON: written as it is
                    params=job.params,
                    deadline=deadline,
                    received_at=received_at,
                    job_id=job_id,
                    item_index=index,
                    job_attempt=job_attempt,
                    weight=job.weight,
                )
                page_bytes += self._produce(topic, msg, acks)
                sent += 1
            self._producer.poll(0)
            if progress:
                progress(sent)
            if time.monotonic() - beat > _HEARTBEAT_S:
                beat = time.monotonic()
                heartbeat(self.engine, job_id)
            sizes.append(page_bytes)
        self._await_acks(acks, sent)
        mark_submitted(self.engine, job_id)
        return sent

    def _unsent_pages(self, job_id: str, total: int, sizes: list[int]) -> Iterator[Sequence[Item]]:
        """The job's unsent items from PostgreSQL, a window of indexes at a time (each
        its own short read), the window sized to about _PAGE_BYTES of messages from the
        last page's ``sizes``: memory stays bounded whatever the items' size."""
        after, width = -1, _FIRST_PAGE_ROWS
        while after < total - 1:
            page = unsent_page(self.engine, job_id, after, width)
            after += width
            if page:
                yield page
                width = max(100, min(10_000, _PAGE_BYTES * len(page) // max(1, sizes[-1])))

    def _produce(self, topic: str, msg: RequestMessage, acks: _Deliveries) -> int:
        """Produce one message (waiting while the producer's queue is full); its size."""
        value = msg.encode()
        while True:
            try:
                self._producer.produce(
                    topic, value=value, key=msg.request_id, on_delivery=acks.on_delivery
                )
                return len(value)
            except BufferError:  # the producer's queue is full: let it drain
                self._producer.poll(0.05)

    def _await_acks(self, acks: _Deliveries, sent: int) -> None:
        deadline = time.monotonic() + _PUBLISH_ACK_S
        while acks.pending > 0 and time.monotonic() < deadline:
            self._producer.poll(0.05)
        if acks.pending or acks.errors:
            raise Unavailable(
                f"could not make {acks.pending or len(acks.errors)} of {sent} job items "
                f"durable in Kafka: {acks.errors[:1]}",
                retry_after_s=5,
            )

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._producer.flush(10)
        self.engine.dispose()
