"""The scheduler process: its parts wired around the dispatch core, started and stopped.

Every decision lives in the core (scheduler/core/); this module only builds and runs
what carries them out (docs/decisions/0047-the-schedulers-core-and-runtime.md):
  * the core behind its host (host.py), the one home of its lock;
  * two engines behind one interface (engines.py): batching (batching.py: a dispatcher
    and a receiver per worker, the model control) and, when a served model generates,
    generation (generation/: the step loop and its flusher);
  * the consumer lanes (lane.py), one per sync class and one for job items, whose
    fetches the feed (feed.py) decodes and hands to the engine that runs each request;
  * the persister (persister.py): the core's planned writes into PostgreSQL, then
    their offsets done;
  * the heartbeat and the model loop (reports.py), and the sweeper that keeps the log
    tables' partitions and retention if this scheduler leads (results/sweeper.py).
Every long-lived thread starts through one supervisor (supervisor.py): the first that
fails stops the process in order, and it exits with status 1 for its orchestrator to
start it again.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from confluent_kafka import Producer

from core import tracing as core_tracing
from core.config import Settings
from core.gc_tuning import tune_gc
from core.kafka import producer_config
from core.memory import trim_every
from core.models.catalog import build_specs, latest
from core.models.causal_lm import CausalLMSpec
from core.models.registry import parse_ref
from core.models.spec import ModelSpec
from core.topics import dead_letter_topic, ensure_topics
from results.db import make_engine
from results.durability import refusal
from results.load import process_id
from results.store import ResultWriter
from results.sweeper import Sweeper
from scheduler.core.dispatch import DispatchCore
from scheduler.core.model_control import ModelControl
from scheduler.runtime import metrics
from scheduler.runtime.batching import BatchingEngine
from scheduler.runtime.deadletter import DeadLetters
from scheduler.runtime.engines import RequestEngine
from scheduler.runtime.feed import Feed
from scheduler.runtime.generation.engine import GenerationEngine
from scheduler.runtime.host import CoreHost
from scheduler.runtime.lane import ConsumerLane, lane_specs
from scheduler.runtime.persister import Persister
from scheduler.runtime.reports import Reports
from scheduler.runtime.supervisor import Supervisor

log = logging.getLogger(__name__)

# On SIGTERM, queued requests get this long to run before the rest is handed back.
SHUTDOWN_DRAIN_S = 10.0
# How long a thread may hold the GIL while another waits for it (Python's default is
# 5 ms). Receivers and dispatchers wait on sockets and locks, then need the GIL at once
# while the consumer and persist threads run Python in bursts: at 5 ms a handoff can
# leave a worker idle longer than its batch takes (docs/bench/gpu.md).
GIL_SWITCH_S = 0.0005
# The exit status after a supervised thread failed: not a clean stop, start me again.
FAILED_EXIT = 1


def _builtin(specs: dict[str, dict[str, ModelSpec]], ref: str) -> ModelSpec | None:
    name, version = parse_ref(ref)
    versions = specs.get(name, {})
    if version:
        return versions.get(version)
    return latest(versions) if versions else None


class SchedulerService:
    def __init__(
        self,
        settings: Settings,
        *,
        socket_dir: Path,
        n_workers: int | None = None,
        models: list[str] | None = None,
    ):
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_S))
        self.settings = settings
        # Host and pid alone repeat across the scheduler containers of one pod (one host
        # name, a PID namespace each): their load reports would overwrite each other.
        self.scheduler_id = process_id(
            settings.topic_prefix,
            f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}",
        )
        self.supervisor = Supervisor(self._thread_failed)
        self.stopping = threading.Event()  # stop consuming
        served = models or [m for m in settings.worker_models.split(",") if m]
        # A generation model runs steps, not batches (decision 32): its own worker
        # process and engine, beside the batching workers. Which models generate is
        # the built-in versions' backend (gristmill-lm@1 is the registry's seed).
        builtins = build_specs(settings)
        gen = [m for m in served if isinstance(_builtin(builtins, m), CausalLMSpec)]
        batched = [m for m in served if m not in gen]
        core = DispatchCore.from_settings(settings)
        self.control = ModelControl(settings, batched, core)
        self.host = CoreHost(core, control=self.control)
        self.db = make_engine(settings.database_url, pool_size=5)
        self.producer = Producer(producer_config(settings))
        self.writer = ResultWriter(
            settings.database_url, inline_max=settings.announce_inline_max_bytes
        )
        self.persister = Persister(
            metrics.timed_store(self.writer),
            DeadLetters(self.producer, dead_letter_topic(settings)),
            self.host.done,
            self.stopping,
            supervisor=self.supervisor,
            threads=settings.persist_threads,
        )
        self.batching = BatchingEngine(
            settings,
            self.host,
            batched,
            socket_dir=socket_dir,
            n_local=settings.workers if n_workers is None else n_workers,
            submit=self.persister.submit,
            supervisor=self.supervisor,
            on_worker=lambda: self.reports.worker_ready(),
            on_status=lambda: self.reports.models_changed.set(),
        )
        # The generation engine is asked first which requests are its; batching runs
        # the rest.
        self.engines: list[RequestEngine] = [self.batching]
        if gen:
            spec = _builtin(builtins, gen[0])
            assert isinstance(spec, CausalLMSpec)
            generation = GenerationEngine(
                self.db,
                spec,
                self.host,
                model=gen[0],
                socket_dir=socket_dir,
                done=self.host.done,
                stopping=self.stopping,
                supervisor=self.supervisor,
                # Which of its versions to hold (decision 67): the registry as read last.
                records=lambda: self.control.records.values(),
                on_worker=lambda: self.reports.announce(),
            )
            self.engines.insert(0, generation)
        self.feed = Feed(self.host, self.engines, lambda: self.control.specs, self.persister.submit)
        # Each sync class and the job items are read by consumers of their own (decision
        # 0011, lane.py ``lane_specs``).
        self.lanes = [
            ConsumerLane(settings, spec, self.feed, self.host, self.scheduler_id)
            for spec in lane_specs(settings)
        ]
        self.reports = Reports(
            self.scheduler_id, self.host, self.engines, self.lanes, self.db, self.stopping
        )

    # ---- life cycle --------------------------------------------------------------------
    def run(self) -> None:
        ensure_topics(self.settings)
        if self.settings.allow_weak_durability:
            log.warning("allow_weak_durability is set: Kafka and PostgreSQL durability unchecked")
        elif (why := refusal(self.settings, engine=self.db)) is not None:
            log.error("%s", why)
            raise SystemExit(why)
        metrics.serve(
            lambda: metrics.state_of(self.host.stats(), self.lanes, self.batching.pool.warming()),
            self.settings,
        )
        core_tracing.setup(self.settings, "gristmill-scheduler")
        self.reports.read_registry()  # before the first worker says hello: what to load
        for engine in self.engines:
            engine.start()
        self.supervisor.start(self.reports.heartbeat_loop, name="heartbeat")
        self.supervisor.start(self.reports.model_loop, name="models")
        # Retention and partitions: every scheduler offers, one leads (advisory lock).
        sweeper = Sweeper(make_engine(self.settings.database_url, pool_size=1), self.settings)
        self.supervisor.start(sweeper.run, self.stopping, name="sweeper")
        # Bursts (a job's results, a rebalance) leave malloc's arenas at their high-water
        # mark; a trim a minute gives the free pages back (core/memory.py).
        self.supervisor.start(trim_every, self.stopping, name="memory")
        # Start-up is done: fewer, cheaper collections from here (core/gc_tuning.py:
        # 26 rather than 40 us of scheduler CPU a persisted row).
        tune_gc()
        # Each persist thread's connection, opened before the first result needs it.
        self.writer.connect_ahead(self.settings.persist_threads)
        for lane in self.lanes:
            lane.start(self.stopping, self.supervisor)
        log.info("scheduler running")
        while not self.stopping.wait(0.1):
            self.producer.poll(0)
        self._shutdown()
        if self.supervisor.failure is not None:
            raise SystemExit(FAILED_EXIT)

    def stop(self, *_: object) -> None:
        self.stopping.set()
        for engine in self.engines:
            engine.stop_restarts()
        self.host.wake()

    def _thread_failed(self, name: str, exc: BaseException) -> None:
        """A supervised thread failed (the supervisor logged it): stop in order."""
        self.stop()

    def _shutdown(self) -> None:
        """Finish in-flight batches, persist, commit, leave the group."""
        failure = self.supervisor.failure
        log.info("scheduler stopping%s", f" (thread {failure[0]} failed)" if failure else "")
        # Run what is already queued (briefly), so the next owner of our partitions
        # need not compute again what we persisted past an unstarted request. Then the
        # dispatchers return after the batch they are running; requests that never
        # started are not committed, so the partitions' next owner re-reads them. What
        # is generating is left to the next owner, which resumes it from its progress.
        self.host.drain(time.time() + SHUTDOWN_DRAIN_S)
        deadline = time.time() + self.settings.batch_timeout_s
        for engine in self.engines:
            engine.finish(deadline)
        self.persister.shutdown()
        self.writer.close()
        for lane in self.lanes:  # final commit, then leave both groups
            lane.finish()
        self.producer.flush(5)
        self.reports.withdraw()
        log.info("scheduler stopped: %s", dict(self.host.stats().counts))

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
