"""The threads between the dispatch core and the worker sockets.

Per worker, a dispatcher asks the core for the worker's next step and sends the batch
it releases; a receiver takes results back in send order and hands the core's plans
for them to the persister. A worker computes one batch at a time; while it runs one, a
second may wait queued on it when batches are short (decision 0012), so sending, batch
forming and result handling overlap the computation. Both threads call the core under
the one lock they share with the rest of the scheduler (decision 0018).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence

from core.models.token_ids import is_tokenized
from core.protocol import WorkBatch
from scheduler.core.batcher import Batch
from scheduler.core.dispatch import DispatchCore, InFlight, Worker, Write
from scheduler.runtime import metrics, tracing
from scheduler.runtime.workerpool import WorkerHandle, WorkerLost

log = logging.getLogger("gristmill.scheduler")

# Longest a dispatcher or receiver sleeps without looking again: a missed wake-up
# (a worker that died without a word) costs at most this.
POLL_S = 0.25


def work_batch(batch: Batch) -> WorkBatch:
    """What the worker gets: token ids alone when the API tier tokenized every input
    (the text stays here, for the rows)."""
    first = batch.items[0].msg
    inputs = [p.msg.input for p in batch.items]
    if all(is_tokenized(x) for x in inputs):
        ids = [x["ids"] for x in inputs]
        return WorkBatch(
            batch.batch_id, batch.key.model, batch.key.version, first.params, ids, True
        )
    return WorkBatch(batch.batch_id, batch.key.model, batch.key.version, first.params, inputs)


class WorkerThreads:
    def __init__(
        self,
        core: DispatchCore,
        cond: threading.Condition,
        submit: Callable[[Sequence[Write]], None],
        *,
        batch_timeout_s: float,
    ):
        self.core = core
        self.cond = cond
        self.submit = submit
        self.batch_timeout_s = batch_timeout_s
        self.handles: list[WorkerHandle] = []
        self.threads: list[threading.Thread] = []

    def add(self, h: WorkerHandle) -> Worker:
        """A worker said hello: serve it until it is lost or dispatching ends."""
        with self.cond:
            w = self.core.add_worker(h.worker_id, h.hello.models, h.hello.worker_class)
            self.handles.append(h)
            self.cond.notify_all()
        t = threading.Thread(
            target=self._dispatch, args=(h, w), daemon=True, name=f"dispatch-{h.worker_id}"
        )
        self.threads.append(t)
        t.start()
        return w

    def join(self, deadline: float) -> None:
        """Wait (until ``deadline``, epoch s) for every dispatcher to return."""
        for t in self.threads:
            t.join(timeout=max(0.1, deadline - time.time()))

    def stop_workers(self) -> None:
        for h in list(self.handles):
            h.stop()

    def _next(self, h: WorkerHandle, w: Worker) -> InFlight | None:
        """Block until the core releases a batch for this worker (None: stop)."""
        with self.cond:
            while h.alive:
                now = time.time()
                step = self.core.schedule(w, now)
                if step.writes:
                    self.submit(step.writes)
                if step.stop:
                    return None
                if step.start is not None:
                    self.cond.notify_all()  # a lane may resume paused partitions
                    return step.start
                wait = step.wait_until - now
                self.cond.wait(min(max(wait, 0.001), POLL_S) if wait < math.inf else POLL_S)
        return None

    def _dispatch(self, h: WorkerHandle, w: Worker) -> None:
        """Send this worker what the core releases; its receiver takes the results."""
        done = threading.Event()  # set when this dispatcher sends nothing more
        receiver = threading.Thread(
            target=self._receive, args=(h, w, done), daemon=True, name=f"results-{h.worker_id}"
        )
        receiver.start()
        try:
            while (entry := self._next(h, w)) is not None:
                try:
                    h.send(tracing.sent(entry.batch, work_batch(entry.batch), h.worker_id))
                except WorkerLost as exc:
                    log.warning(
                        "%s; handing back batch %s (%d items)",
                        exc,
                        entry.batch.batch_id,
                        len(entry.batch.items),
                    )
                    with self.cond:
                        self.core.send_failed(w, entry, time.time())
                        self.cond.notify_all()
                    return
                with self.cond:
                    entry.sent = True
                    self.cond.notify_all()
        finally:
            with self.cond:
                done.set()
                self.cond.notify_all()
            receiver.join()
            with self.cond:
                if not h.alive:
                    self.core.retire(w)
                    if h in self.handles:
                        self.handles.remove(h)

    def _receive(self, h: WorkerHandle, w: Worker, done: threading.Event) -> None:
        """Results in the order the batches were sent; a lost worker hands back all it held."""
        while True:
            with self.cond:
                while not (w.queue and w.queue[0].sent) and not done.is_set():
                    self.cond.wait(POLL_S)
                if not (w.queue and w.queue[0].sent):
                    return  # the dispatcher is done and nothing was sent
                head = w.queue[0]
            try:
                result = h.receive(self.batch_timeout_s)
            except WorkerLost as exc:
                with self.cond:
                    lost = self.core.on_lost(w, str(exc), ran=exc.ran, now=time.time())
                    if h in self.handles:
                        self.handles.remove(h)
                    self.cond.notify_all()
                metrics.worker_lost(lost.held, ran=exc.ran, error=str(exc))
                for i, b in enumerate(lost.held):
                    log.warning(
                        "%s; handing back batch %s (%d items%s)",
                        exc,
                        b.batch_id,
                        len(b.items),
                        "" if i == 0 else ", queued behind it, never started",
                    )
                self.submit(lost.writes)
                return
            metrics.batch_done(h.worker_id, head.batch, result, self.core.max_batch)
            tracing.returned(head.batch, result)
            with self.cond:
                writes = self.core.on_result(w, head, result, time.time())
                self.cond.notify_all()
            self.submit(writes)
