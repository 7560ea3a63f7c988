"""The batching engine: requests queued in the dispatch core, batches on worker processes.

One of the scheduler's two engines (scheduler/runtime/engines.py). The dispatch core
(scheduler/core/dispatch.py) queues what the lanes fetch and decides every batch; per
worker a dispatcher and a receiver carry its steps out (worker_threads.py); the model
control (scheduler/core/model_control.py) moves the workers toward the registry's
versions. All of it reaches the core through its host.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from core.config import Settings
from core.load_report import LoadReport
from core.models.readiness import Readiness
from core.protocol import ModelStatus
from scheduler.core.batcher import Pending
from scheduler.core.offsets import TopicPartition
from scheduler.core.plans import Write
from scheduler.runtime.engines import Announcement
from scheduler.runtime.host import Commands, CoreHost
from scheduler.runtime.supervisor import Supervisor
from scheduler.runtime.worker_threads import WorkerThreads
from scheduler.runtime.workerpool import WorkerHandle, WorkerPool

log = logging.getLogger(__name__)


class BatchingEngine:
    def __init__(
        self,
        settings: Settings,
        host: CoreHost,
        models: list[str],
        *,
        socket_dir: Path,
        n_local: int,
        submit: Callable[[Sequence[Write]], None],
        supervisor: Supervisor,
        on_worker: Callable[[], None] = lambda: None,
        on_status: Callable[[], None] = lambda: None,
    ):
        self.host = host
        self.on_worker = on_worker  # a worker said hello: the service announces it
        self.on_status = on_status  # a worker's version changed: the model loop looks
        self.workers = WorkerThreads(
            host.core,
            host.cond,
            submit,
            batch_timeout_s=settings.batch_timeout_s,
            supervisor=supervisor,
        )
        self.pool = WorkerPool(
            socket_path=socket_dir / "workers.sock",
            n_local=n_local if models else 0,
            models=models,
            on_ready=self._on_ready,
            on_status=self._on_status,
            preload=False,  # the model control says what to load: the registry's versions
            supervisor=supervisor,
        )

    # ---- the engine's interface --------------------------------------------------------
    def runs(self, model: str) -> bool:
        return True  # whatever no other engine runs

    def take(self, items: list[Pending], owned: set[TopicPartition]) -> None:
        self.host.accept(items, [], owned)

    def revoke(self, tps: list[TopicPartition]) -> None:
        self.host.revoke(tps)

    def start(self) -> None:
        self.pool.start()

    def refresh(self) -> list[Readiness]:
        commands, readiness = self.host.models_tick()
        self._send(commands)
        return readiness

    def announced(self) -> list[Announcement]:
        return [
            Announcement(ref, max_batch, profile)
            for ref, (max_batch, profile) in self.host.live_models().items()
        ]

    def report(self, report: LoadReport) -> None:
        """Nothing to add: the core's load report is this engine's capacity."""

    def stop_restarts(self) -> None:
        self.pool.stop_restarts()

    def finish(self, deadline: float) -> None:
        """The dispatchers return after the batch they run; then the workers stop."""
        self.workers.join(deadline)
        self.workers.stop_workers()
        self.pool.stop()

    # ---- workers (the pool's accept and reader threads) -----------------------------------
    def _on_ready(self, h: WorkerHandle) -> None:
        w = self.workers.add(h)
        self._send(self.host.worker_joined(h, w, h.hello))
        self.on_worker()

    def _on_status(self, h: WorkerHandle, status: ModelStatus) -> None:
        """A worker's reader thread: no I/O here but the commands it answers with."""
        self._send(self.host.worker_status(h, status))
        self.on_status()

    def _send(self, commands: Commands) -> None:
        for handle, msg in commands:
            if isinstance(handle, WorkerHandle) and not handle.command(msg):
                log.warning("worker %s is gone; %r not sent", handle.worker_id, msg)
