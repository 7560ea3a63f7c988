"""Phase 2 of a job submission (decision 10): a recorded job's items put in Kafka, then
the job marked ``submitted``. A crash here leaves a ``submitting`` job whose heartbeat
goes stale; any API instance then finishes it (request ids are deterministic, so items
produced twice still yield one result row each).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from confluent_kafka import KafkaError, Message, Producer

from core.config import Settings
from core.errors import Unavailable
from core.kafka import producer_config
from core.memory import trim
from core.topics import request_topic
from core.vocab import PriorityClass
from ingest.acceptance.message import JobItems
from ingest.acceptance.ports import StagedItems
from ingest.jobs.pacing import PUBLISH_SLICE, Pacer
from ingest.jobs.publish_process import PublishProcess, StagedRef
from ingest.jobs.upload import Item, Staged
from results.db import make_engine
from results.job_items import unsent_page
from results.job_reuse import copy_reused
from results.job_submission import claim_stale, heartbeat, job_to_publish, mark_submitted

log = logging.getLogger(__name__)

_FIRST_PAGE_ROWS = 100  # item rows read for Kafka in the first page of a publish
_PAGE_BYTES = 4 << 20  # later pages are sized to about this many bytes of messages
_QUEUE_KIB = 16 << 10  # 16 MiB: a local broker keeps up with far less in flight
_HEARTBEAT_S = 2.0  # a publishing job's heartbeat, well inside submit_stale_s
# How long the items produced by one publish may take to be acknowledged by Kafka.
_PUBLISH_ACK_S = 120.0


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

    def __init__(self, settings: Settings, pacer: Pacer | None = None, child: bool = False):
        self.settings = settings
        # Publishing gives way to the instance's sync requests (ingest/jobs/pacing.py).
        self.pacer = pacer
        # ``child``: publishes run in a child process (decision 74), these threads only
        # when it cannot take one.
        self.child = PublishProcess(settings, pacer) if child else None
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

    async def publish(self, job_id: str, staged: StagedItems | None = None) -> int:
        """``staged``: the new job's staged file, read instead of its rows."""
        loop = asyncio.get_running_loop()
        if self.child is not None:
            ref = StagedRef.of(staged) if isinstance(staged, Staged) else None
            if staged is None or ref is not None:
                try:
                    return await asyncio.wrap_future(self.child.submit(job_id, ref))
                except (BrokenProcessPool, OSError) as exc:  # the child died, or could not
                    # open the staged file: this publish runs here instead (items sent
                    # twice still make one result each)
                    log.warning(
                        "job %s: not published by its child (%s); publishing here", job_id, exc
                    )
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
        staged: StagedItems | None = None,
    ) -> int:
        """Produce every item whose current attempt has no result yet (all of them for a
        new job; the unfinished ones after a crash or a retry). A new job's items come
        from its staged file when given (the same rows the COPY wrote, none of them sent
        yet), else from PostgreSQL. Blocking. Returns how many items were produced.

        An incremental job's reused items (decision 61) are copied here, not sent: after
        the changed items are in Kafka, so the copy runs while the model computes them;
        read from PostgreSQL, before, so the items copied are not read as unsent."""
        with self.engine.connect() as conn:
            job = job_to_publish(conn, job_id)
        if job is None:
            return 0
        items = JobItems.of(job, job_id)  # the same for every item: worked out once
        incremental = job.base_job_id is not None
        if staged is None:
            if incremental:
                copy_reused(self.engine, job_id)
            sizes: list[int] = []  # bytes of messages in the page just sent: sizes the next
            pages = self._unsent_pages(job_id, int(job.total_items), sizes)
            sent = self._send(job_id, items, pages, sizes, progress)
        else:
            sent = self._send(job_id, items, staged.pages(_PAGE_BYTES), [], progress)
            if incremental:
                # Matched at recording, its base row gone since (expired, deleted): computed.
                left = staged.reused - copy_reused(self.engine, job_id)
                if left:
                    sent += self._send(job_id, items, staged.pages(_PAGE_BYTES, left), [], None)
        mark_submitted(self.engine, job_id)
        trim()  # the publish's pages and producer buffers, back to the OS (core/memory.py)
        return sent

    def _send(
        self,
        job_id: str,
        items: JobItems,
        pages: Iterable[Sequence[Item]],
        sizes: list[int],
        progress: Callable[[int], None] | None,
    ) -> int:
        """Produce ``pages`` and wait until Kafka has them all; how many were produced.
        Appends each page's bytes to ``sizes`` (what sizes the next page read)."""
        topic = request_topic(self.settings, PriorityClass.JOBS)
        acks = _Deliveries()
        encode = items.encoder()
        sent = 0
        beat = sliced = time.monotonic()
        for page in pages:
            page_bytes = 0
            acks.sent(len(page))
            for index, value, request_id, job_attempt in page:
                if self.pacer is not None and sent % PUBLISH_SLICE == PUBLISH_SLICE - 1:
                    now = time.monotonic()
                    time.sleep(self.pacer.after(now - sliced))  # no GIL held meanwhile
                    sliced = time.monotonic()
                raw = encode(index, value, request_id, job_attempt)
                page_bytes += self._produce(topic, request_id, raw, acks)
                sent += 1
            self._producer.poll(0)
            if progress:
                progress(sent)
            if time.monotonic() - beat > _HEARTBEAT_S:
                beat = time.monotonic()
                heartbeat(self.engine, job_id)
            sizes.append(page_bytes)
        self._await_acks(acks, sent)
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

    def _produce(self, topic: str, key: str, value: bytes, acks: _Deliveries) -> int:
        """Produce one message (waiting while the producer's queue is full); its size."""
        while True:
            try:
                self._producer.produce(topic, value=value, key=key, on_delivery=acks.on_delivery)
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
        if self.child is not None:
            self.child.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._producer.flush(10)
        self.engine.dispose()
