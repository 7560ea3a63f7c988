"""The threads between the dispatch core and the worker sockets.

Per worker, a dispatcher asks the core for the worker's next step and sends the batch
it releases; a receiver takes results back in send order and hands the core's plans
for them to the persister. A worker computes one batch at a time; while it runs one, a
second may wait queued on it when batches are short (decision 0012), so sending, batch
forming and result handling overlap the computation. Both threads reach the core
through its host (scheduler/runtime/host.py), the one home of its lock (decisions 0018,
0047), and start through the supervisor: an exception either does not expect stops the
process rather than leave its worker idle.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence

from core.models.token_ids import is_tokenized
from core.protocol import WorkBatch
from scheduler.core.batcher import Batch
from scheduler.core.interface import SchedulerInterface
from scheduler.core.plans import Worker, Write
from scheduler.runtime import metrics, tracing
from scheduler.runtime.host import CoreHost
from scheduler.runtime.supervisor import Supervisor
from scheduler.runtime.workerpool import WorkerHandle, WorkerLost

log = logging.getLogger(__name__)


def work_batch(batch: Batch) -> WorkBatch:
    """What the worker gets: token ids alone when the API tier tokenized every input
    (the text stays here, for the rows)."""
    first = batch.items[0].msg
    inputs = [p.msg.input for p in batch.items]
    deadline = min(p.deadline for p in batch.items)
    key = batch.key
    if all(is_tokenized(x) for x in inputs):
        ids = [x["ids"] for x in inputs]
        return WorkBatch(
            batch.batch_id, key.model, key.version, first.params, ids, True, deadline=deadline
        )
    return WorkBatch(
        batch.batch_id, key.model, key.version, first.params, inputs, deadline=deadline
    )


class WorkerThreads:
    def __init__(
        self,
        core: SchedulerInterface,
        cond: threading.Condition,
        submit: Callable[[Sequence[Write]], None],
        *,
        batch_timeout_s: float,
        supervisor: Supervisor | None = None,
    ):
        """``core`` and ``cond``: the dispatch core and the condition every call into it
        is made under (the scheduler's host's); ``submit``: the persister's queue."""
        self.host = CoreHost(core, cond)
        self.submit = submit
        self.batch_timeout_s = batch_timeout_s
        self.supervisor = supervisor or Supervisor()
        self.limits = core.batch_limits()  # live and read-only: for the fill-ratio metric
        self.handles: list[WorkerHandle] = []
        self.threads: list[threading.Thread] = []

    def add(self, h: WorkerHandle) -> Worker:
        """A worker said hello: serve it until it is lost or dispatching ends."""
        w = self.host.add_worker(h.worker_id, h.hello.models, h.hello.worker_class)
        self.handles.append(h)
        self.threads.append(
            self.supervisor.start(self._dispatch, h, w, name=f"dispatch-{h.worker_id}")
        )
        return w

    def join(self, deadline: float) -> None:
        """Wait (until ``deadline``, epoch s) for every dispatcher to return."""
        for t in self.threads:
            t.join(timeout=max(0.1, deadline - time.time()))

    def stop_workers(self) -> None:
        for h in list(self.handles):
            h.stop()

    def _forget(self, h: WorkerHandle) -> None:
        with contextlib.suppress(ValueError):  # the receiver and dispatcher both may
            self.handles.remove(h)

    def _dispatch(self, h: WorkerHandle, w: Worker) -> None:
        """Send this worker what the core releases; its receiver takes the results."""
        done = threading.Event()  # set when this dispatcher sends nothing more
        receiver = self.supervisor.start(self._receive, h, w, done, name=f"results-{h.worker_id}")
        try:
            while (entry := self.host.next_step(w, lambda: h.alive, self.submit)) is not None:
                try:
                    h.send(tracing.sent(entry.batch, work_batch(entry.batch), h.worker_id))
                except WorkerLost as exc:
                    log.warning(
                        "%s; handing back batch %s (%d items)",
                        exc,
                        entry.batch.batch_id,
                        len(entry.batch.items),
                    )
                    self.host.send_failed(w, entry)
                    return
                self.host.sent(w, entry)
        finally:
            done.set()
            self.host.wake()
            receiver.join()
            if not h.alive:
                self.host.retire(w)
                self._forget(h)

    def _receive(self, h: WorkerHandle, w: Worker, done: threading.Event) -> None:
        """Results in the order the batches were sent; a lost worker hands back all it held."""
        while (head := self.host.next_result(w, done)) is not None:
            try:
                result = h.receive(self.batch_timeout_s)
            except WorkerLost as exc:
                lost = self.host.lost(w, str(exc), ran=exc.ran)
                self._forget(h)
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
            metrics.batch_done(h.worker_id, head.batch, result, self.limits)
            tracing.returned(head.batch, result)
            self.submit(self.host.result(w, head, result))
