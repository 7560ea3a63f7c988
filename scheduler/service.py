"""The scheduler process: Kafka, worker sockets and PostgreSQL around the dispatch core.

Every decision lives in the core (scheduler/dispatch.py); this module only runs it.
Threads, each with one job:
  * two consumer lanes (scheduler/lane.py), one for sync classes and one for job
    items, each read Kafka with its own consumer, commit offsets and answer
    rebalances; what they read is decoded here and handed to the core;
  * per worker a dispatcher and a receiver (scheduler/worker_threads.py);
  * the persister's pool (scheduler/persister.py) stores the core's planned writes and
    reports their offsets done;
  * a heartbeat reports load and refreshes the cancelled jobs;
  * a model loop reads the registry every second, tells the workers which versions to
    load and unload (scheduler/model_control.py) and reports each version's readiness;
    the workers' status messages wake it;
  * the sweeper keeps the log tables' partitions and retention, if this scheduler
    leads (results/sweeper.py).
They share the core under one condition variable (decision 0018).
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

from confluent_kafka import Message, Producer

from core import tracing as core_tracing
from core.config import Settings
from core.kafka import producer_config
from core.models.catalog import build_specs, latest
from core.models.causal_lm import CausalLMSpec
from core.models.registry import parse_ref
from core.models.spec import ModelSpec
from core.protocol import ModelStatus
from core.topics import dead_letter_topic, ensure_topics
from results import modelregistry
from results.db import make_engine
from results.durability import refusal
from results.faults import first_line
from results.jobs import cancelled_unfinished_stmt
from results.load import (
    forget_scheduler,
    process_id,
    publish_scheduler_metrics,
    report_scheduler,
)
from results.modelregistry import Readiness, record_from_row, versions_stmt
from results.store import ResultWriter
from results.sweeper import Sweeper
from scheduler import metrics, tracing
from scheduler.batcher import Pending
from scheduler.deadletter import DeadLetters
from scheduler.dispatch import DispatchCore, Reject
from scheduler.gc_tuning import tune_gc
from scheduler.generation.service import GenerationService
from scheduler.intake import decode
from scheduler.lane import ConsumerLane, held_lag, lane_specs
from scheduler.model_control import Command, Commandable, ModelControl
from scheduler.offsets import TopicPartition
from scheduler.persister import Persister
from scheduler.worker_threads import WorkerThreads
from scheduler.workerpool import WorkerHandle, WorkerPool

log = logging.getLogger("gristmill.scheduler")

# On SIGTERM, queued requests get this long to run before the rest is handed back.
SHUTDOWN_DRAIN_S = 10.0
# Load reports four times a second: admission decides on them, and a stale view lets
# a burst through for its whole age (docs/decisions/0008).
LOAD_REPORT_S = 0.25
CANCELLED_REFRESH_S = 1.0
METRICS_PUBLISH_S = 1.0  # the dashboard's step (core/metrics_window.py)
ANNOUNCE_S = 5.0
# The registry is read, and each version's readiness reported, this often (s): a promote
# or a canary reaches the workers within it, and the API treats readiness older than
# results.modelregistry.READINESS_STALE_S (5 s) as gone.
REGISTRY_REFRESH_S = 1.0
# How long a thread may hold the GIL while another waits for it (Python's default is
# 5 ms). Receivers and dispatchers wait on sockets and locks, then need the GIL at once
# while the consumer and persist threads run Python in bursts: at 5 ms a handoff can
# leave a worker idle longer than its batch takes (docs/bench/gpu.md).
GIL_SWITCH_S = 0.0005


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
        self.core = DispatchCore.from_settings(settings)
        served = models or [m for m in settings.worker_models.split(",") if m]
        # A generation model runs steps, not batches (decision 32): its own worker
        # process and step loop, beside the batching workers. Which models generate is
        # the built-in versions' backend (gristmill-lm@1 is the registry's seed).
        builtins = build_specs(settings)
        gen = [m for m in served if isinstance(_builtin(builtins, m), CausalLMSpec)]
        batched = [m for m in served if m not in gen]
        self.control = ModelControl(settings, batched, self.core)
        self.models_changed = threading.Event()  # a worker reported; the model loop runs now
        self.cond = threading.Condition()  # the one lock around the core
        self.stopping = threading.Event()  # stop consuming
        self.engine = make_engine(settings.database_url, pool_size=5)
        self.producer = Producer(producer_config(settings))
        self.writer = ResultWriter(settings.database_url)
        self.persister = Persister(
            metrics.timed_store(self.writer),
            DeadLetters(self.producer, dead_letter_topic(settings)),
            self._done,
            self.stopping,
        )
        self.workers = WorkerThreads(
            self.core, self.cond, self.persister.submit, batch_timeout_s=settings.batch_timeout_s
        )
        n_local = settings.workers if n_workers is None else n_workers
        self.pool = WorkerPool(
            socket_path=socket_dir / "workers.sock",
            n_local=n_local if batched else 0,
            models=batched,
            on_ready=self._on_worker_ready,
            on_status=self._on_status,
            preload=False,  # the model control says what to load: the registry's versions
        )
        self.gen: GenerationService | None = None
        self.gen_pool: WorkerPool | None = None
        if gen:
            spec = _builtin(builtins, gen[0])
            assert isinstance(spec, CausalLMSpec)
            self.gen = GenerationService(self.engine, spec, self._done, self.stopping)
            self.gen_pool = WorkerPool(
                socket_path=socket_dir / "lm.sock",
                n_local=1,
                models=gen[:1],
                on_ready=self.gen.on_worker,
            )
        # Sync traffic and job items are read by separate consumers (decision 0011).
        self.lanes = [
            ConsumerLane(settings, spec, self, self.scheduler_id) for spec in lane_specs(settings)
        ]

    @property
    def specs(self) -> dict[str, dict[str, ModelSpec]]:
        """Every known version's spec (intake keys batches by their parameters)."""
        return self.control.specs

    def _done(self, offsets: list[tuple[TopicPartition, int]], rows: int) -> None:
        with self.cond:
            self.core.done(offsets, rows)

    # ---- workers and the registry ------------------------------------------------------
    def _on_worker_ready(self, h: WorkerHandle) -> None:
        w = self.workers.add(h)
        with self.cond:
            self.control.add_worker(
                h, w, h.hello.memory_budget_bytes, h.hello.accepts, h.hello.models, time.time()
            )
            commands = self.control.tick(time.time())
            self.cond.notify_all()
        self._send(commands)
        self.models_changed.set()
        self._announce()

    def _on_status(self, h: WorkerHandle, status: ModelStatus) -> None:
        """A worker's reader thread: no I/O here but the commands it answers with."""
        with self.cond:
            self.control.on_status(h, status, time.time())
            commands = self.control.tick(time.time())
            self.cond.notify_all()
        self._send(commands)
        self.models_changed.set()

    def _send(self, commands: list[tuple[Commandable, Command]]) -> None:
        for handle, msg in commands:
            if isinstance(handle, WorkerHandle) and not handle.command(msg):
                log.warning("worker %s is gone; %r not sent", handle.worker_id, msg)

    def _model_loop(self) -> None:
        """Read the registry, move the workers toward it, report readiness."""
        ticks = 0
        while not self.stopping.is_set():
            self.models_changed.wait(REGISTRY_REFRESH_S)
            self.models_changed.clear()
            ticks += 1
            self._read_registry()
            with self.cond:
                commands = self.control.tick(time.time())
                readiness = self.control.readiness() + self._gen_readiness()
                curves = self.core.class_curves() if ticks % round(ANNOUNCE_S) == 0 else {}
                self.cond.notify_all()
            self._send(commands)
            try:
                with self.engine.begin() as conn:
                    modelregistry.report_readiness(conn, self.scheduler_id, readiness)
                    for (ref, cls), (limit, profile, n) in curves.items():
                        modelregistry.report_curve(conn, *ref, cls, limit, profile, n)
            except Exception as exc:  # PostgreSQL down: the next pass reports
                log.warning("readiness report failed: %s", first_line(exc))

    def _gen_readiness(self) -> list[Readiness]:
        """The generation worker's version: ready while its process is connected,
        loading until it says hello (the API answers 503 with Retry-After then)."""
        if self.gen is None:
            return []
        ready = sum(1 for h in self.gen.handles if h.alive)
        spec = self.gen.spec
        return [Readiness(spec.name, spec.version, ready=ready, loading=0 if ready else 1)]

    def _read_registry(self) -> None:
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(versions_stmt()).all()
        except Exception as exc:  # keep what was read last; the built-ins before that
            log.warning("model registry read failed: %s", first_line(exc))
            return
        records = [record_from_row(r) for r in rows]
        previous = {r.name: r.previous_live for r in rows if r.previous_live}
        with self.cond:
            self.control.set_registry(records, previous)

    def _announce(self) -> None:
        with self.cond:
            live = self.core.live_models()
        try:
            with self.engine.begin() as conn:
                for (name, version), (max_batch, profile) in live.items():
                    modelregistry.announce(conn, name, version, max_batch, profile)
        except Exception as exc:  # PostgreSQL down: the next heartbeat retries
            log.warning("model announce failed: %s", first_line(exc))
        if self.gen is not None:
            self.gen.announce()

    def _heartbeat_loop(self) -> None:
        ticks = 0
        while not self.stopping.wait(LOAD_REPORT_S):
            ticks += 1
            self._report_load(publish=ticks % round(METRICS_PUBLISH_S / LOAD_REPORT_S) == 0)
            if ticks % round(CANCELLED_REFRESH_S / LOAD_REPORT_S) == 0:
                self._refresh_cancelled()
            if ticks % round(ANNOUNCE_S / LOAD_REPORT_S) == 0:
                self._announce()

    def _report_load(self, *, publish: bool = False) -> None:
        """Capacity and backlog for the API's admission control; with ``publish``, this
        scheduler's metrics window for the dashboard too."""
        lag = held_lag(self.lanes)
        with self.cond:
            report = self.core.load(lag)
        if self.gen is not None and self.gen.kv is not None:
            report.kv = {self.gen.spec.ref: self.gen.kv}
        # Read outside the lock above: the window's gauges take it themselves.
        window = metrics.window(time.time()) if publish else None
        try:
            with self.engine.begin() as conn:
                report_scheduler(conn, self.scheduler_id, report)
                if window is not None:
                    publish_scheduler_metrics(conn, self.scheduler_id, window)
        except Exception as exc:
            log.warning("load report failed: %s", first_line(exc))

    def _refresh_cancelled(self) -> None:
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(cancelled_unfinished_stmt())
                ids = frozenset((str(r[0]), int(r[1])) for r in rows)
        except Exception as exc:
            log.warning("cancelled-jobs refresh failed: %s", first_line(exc))
            return
        with self.cond:
            self.core.set_cancelled(ids)

    # ---- what the consumer lanes call (each from its own thread) --------------------
    def accept(self, msgs: list[Message], owned: set[TopicPartition], now: float) -> None:
        """Queue fetched requests; unreadable ones are recorded and skipped."""
        items: list[Pending] = []
        generate: list[Pending] = []
        rejects: list[Reject] = []
        for msg in msgs:
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            assert topic is not None and partition is not None and offset is not None
            _, ts_ms = msg.timestamp()
            got = decode(
                msg.value(),
                tp=(topic, partition),
                offset=offset,
                produced_at=ts_ms / 1000.0 if ts_ms > 0 else None,
                now=now,
                specs=self.specs,
            )
            if isinstance(got, Pending):
                got.trace = tracing.context_of(msg)
                if self.gen is not None and got.msg.model == self.gen.spec.name:
                    generate.append(got)
                else:
                    items.append(got)
            else:
                rejects.append(got)
        with self.cond:
            rejects = self.core.accept(items, rejects, owned)
            generate = self.core.hold(generate, owned)
            self.cond.notify_all()
        if rejects:
            self.persister.submit(rejects)
        if generate and self.gen is not None:
            self.gen.submit(generate)

    def give_up_partitions(self, tps: list[TopicPartition]) -> None:
        with self.cond:
            self.core.revoke(tps)
        if self.gen is not None:
            self.gen.revoke(tps)

    def committable(self, only: set[TopicPartition]) -> dict[TopicPartition, int]:
        with self.cond:
            return self.core.committable(only)

    def mark_committed(self, positions: dict[TopicPartition, int]) -> None:
        with self.cond:
            self.core.mark_committed(positions)

    def wanted_paused(self, paused: frozenset[int]) -> frozenset[int]:
        with self.cond:
            return self.core.paused(paused)

    # ---- life cycle --------------------------------------------------------------------
    def run(self) -> None:
        ensure_topics(self.settings)
        if self.settings.allow_weak_durability:
            log.warning("allow_weak_durability is set: Kafka and PostgreSQL durability unchecked")
        elif (why := refusal(self.settings, engine=self.engine)) is not None:
            log.error("%s", why)
            raise SystemExit(why)
        metrics.serve(self, self.settings)
        core_tracing.setup(self.settings, "gristmill-scheduler")
        self._read_registry()  # before the first worker says hello: what to load
        self.pool.start()
        if self.gen is not None and self.gen_pool is not None:
            self.gen.start()
            self.gen_pool.start()
        threading.Thread(target=self._heartbeat_loop, daemon=True, name="heartbeat").start()
        threading.Thread(target=self._model_loop, daemon=True, name="models").start()
        # Retention and partitions: every scheduler offers, one leads (advisory lock).
        sweeper = Sweeper(make_engine(self.settings.database_url, pool_size=1), self.settings)
        threading.Thread(
            target=sweeper.run, args=(self.stopping,), daemon=True, name="sweeper"
        ).start()
        # Start-up is done: fewer, cheaper collections from here (scheduler/gc_tuning.py:
        # 26 rather than 40 us of scheduler CPU a persisted row, bench.store.persist).
        tune_gc()
        for lane in self.lanes:
            lane.start(self.stopping)
        log.info("scheduler running")
        while not self.stopping.wait(0.1):
            self.producer.poll(0)
        self._shutdown()

    def stop(self, *_: object) -> None:
        self.stopping.set()
        self.pool.stop_restarts()
        if self.gen_pool is not None:
            self.gen_pool.stop_restarts()
        with self.cond:
            self.cond.notify_all()

    def _shutdown(self) -> None:
        """Finish in-flight batches, persist, commit, leave the group."""
        log.info("scheduler stopping")
        # Run what is already queued (briefly), so the next owner of our partitions
        # need not compute again what we persisted past an unstarted request. Then the
        # dispatchers return after the batch they are running; requests that never
        # started are not committed, so the partitions' next owner re-reads them.
        drain_until = time.time() + SHUTDOWN_DRAIN_S
        with self.cond:
            while not self.core.idle() and time.time() < drain_until and self.core.any_alive():
                self.cond.wait(0.05)
            self.core.stop_dispatching()
            self.cond.notify_all()
        self.workers.join(deadline=time.time() + self.settings.batch_timeout_s)
        self.workers.stop_workers()
        self.persister.shutdown()
        self.writer.close()
        if self.gen is not None and self.gen_pool is not None:
            # What is generating is left to the partitions' next owner, which resumes
            # it from the progress rows flushed here; finished rows are written first.
            self.gen.join()
            self.gen.stop_workers()
            self.gen_pool.stop()
        for lane in self.lanes:  # final commit, then leave both groups
            lane.finish()
        self.producer.flush(5)
        self.pool.stop()
        try:  # stop counting toward capacity at once rather than after the staleness window
            with self.engine.begin() as conn:
                forget_scheduler(conn, self.scheduler_id)
                modelregistry.forget_readiness(conn, self.scheduler_id)
        except Exception as exc:
            log.warning("could not withdraw load report: %s", first_line(exc))
        log.info("scheduler stopped: %s", self.core.stats)

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
