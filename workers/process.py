"""The worker process: load models, warm up, then run one batch at a time.

It connects to its scheduler's socket (or, started by hand, to several
schedulers' sockets: decision 0014), announces the models it serves with their
measured cost profile, and then answers every WorkBatch with a WorkResult to the
scheduler that sent it, in the order the batches came. When its last scheduler
goes away the worker exits: it never runs work that nobody will persist.

A scheduler may send the next batch before the current one's result is back
(decision 0012). A thread per scheduler reads its batches into one queue; the main
thread launches them (``Model.launch``: a GPU model packs a batch and enqueues its
work behind the running one), most urgent first: the earliest deadline, each
scheduler's in the order it sent them (workers/ready.py, decision 76); a finisher
thread waits for each launched batch in turn (``Model.finish``) and sends its result.
So the device computes one batch at a time, in order, while the host prepares the next
ones and ships the last one's result; at most ``worker_max_launched`` (3) batches are
launched and unfinished, the rest wait in the queue (and go back unrun on a stop). A
batch that a model computed outright in ``launch`` (CPU models, sim) has its result sent
before the next batch is launched: if the next one kills the process, the scheduler
blames that one, not a batch that had already finished.

A worker spawned by a scheduler ignores SIGTERM/SIGINT (a stop signal sent to
the whole process group must not cut the scheduler's drain short: the scheduler
stops its workers itself once their work is persisted) and asks the kernel to
kill it when that scheduler dies, so even a worker hung in a model cannot
outlive it. A worker started by hand treats SIGTERM/SIGINT gracefully: it
finishes the batch it is computing, sends the result, then exits.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection
from pathlib import Path
from types import FrameType
from typing import Any

from core import tracing
from core.config import Settings, WorkerSettings
from core.protocol import (
    GenStep,
    GenStepResult,
    Hello,
    ModelCommand,
    ModelStatus,
    WorkBatch,
    WorkResult,
)
from core.vocab import ModelRef
from workers import tracing as worker_tracing
from workers.holder import Holder
from workers.metrics import DeviceSampler
from workers.models.base import Launched, Model, ModelUnavailable
from workers.models.loader import boot_records, load_record
from workers.ready import ReadyQueue

REDIAL_S = 0.5  # how often a worker looks for a scheduler that went away
log = logging.getLogger(__name__)


@dataclass
class _Started:
    batch: WorkBatch | GenStep
    job: Launched | None  # None: launching failed (``error``), or a step (``step``)
    error: str | None
    launched_at: float  # epoch s
    to: Connection  # the scheduler that sent it, which gets the result
    unavailable: ModelUnavailable | None = None  # not run, through no fault of its inputs
    step: GenStepResult | None = None  # a generation step, computed when it was launched
    received_at: float | None = None  # epoch s: read off the scheduler's pipe


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def _unavailable(batch: WorkBatch, exc: ModelUnavailable, start: float) -> WorkResult:
    return WorkResult(
        batch.batch_id,
        None,
        str(exc),
        start,
        time.time(),
        unavailable=True,
        retry_after_s=exc.retry_after_s,
    )


def prepare_batch(holder: Holder, batch: WorkBatch) -> Any:
    """Start a batch's host-side work as it arrives (Model.prepare), or None."""
    model = holder.models.get(ModelRef(batch.model, batch.version))
    if model is None:
        return None
    try:
        return model.prepare(batch.inputs, token_ids=batch.token_ids, deadline=batch.deadline)
    except Exception:  # launch does the work itself, and reports what fails there
        log.exception("preparing batch %s failed", batch.batch_id)
        return None


def launch_batch(holder: Holder, batch: WorkBatch, to: Connection, ahead: Any = None) -> _Started:
    launched_at = time.time()
    ref = ModelRef(batch.model, batch.version)
    model = holder.begin(ref)
    if model is None:  # unloaded meanwhile: not the batch's fault, the scheduler resends it
        err = ModelUnavailable(f"model {batch.model}@{batch.version} is not loaded on this worker")
        return _Started(batch, None, str(err), launched_at, to, err)
    try:
        job = model.launch(batch.inputs, batch.params, token_ids=batch.token_ids, ahead=ahead)
        return _Started(batch, job, None, launched_at, to)
    except ModelUnavailable as exc:
        holder.end(ref)
        log.warning("batch %s handed back: %s", batch.batch_id, exc)
        return _Started(batch, None, str(exc), launched_at, to, exc)
    except Exception as exc:  # the scheduler decides about retries; we only report
        holder.end(ref)
        log.warning("batch %s failed: %s", batch.batch_id, exc)
        return _Started(batch, None, _describe(exc), launched_at, to)


def run_step(models: dict[ModelRef, Model], step: GenStep, to: Connection) -> _Started:
    """One step of continuous batching, computed now on the pool of the scheduler ``to``
    (workers/models/causal_lm/serving.py). A failure is reported, not raised: the
    scheduler's policy recomputes what the step held."""
    started = time.time()
    try:
        model = models[ModelRef(step.model, step.version)]
        run = getattr(model, "step", None)
        if run is None:
            raise TypeError(f"{step.model}@{step.version} does not generate")
        output = run(id(to), step.plan)
        result = GenStepResult(step.batch_id, output, None, started, time.time())
    except Exception as exc:
        log.warning("step %s failed: %s", step.batch_id, exc)
        result = GenStepResult(step.batch_id, None, _describe(exc), started, time.time())
    return _Started(step, None, result.error, started, to, step=result)


def _forget(models: dict[ModelRef, Model], conn: Connection) -> None:
    """A scheduler went away: the KV pools kept for it are freed."""
    for model in list(models.values()):  # the loader thread may unload one meanwhile
        release = getattr(model, "release", None)
        if release is not None:
            release(id(conn))


def finish_batch(
    holder: Holder, started: _Started, start: float, report_stats: bool = False
) -> WorkResult:
    """Wait for a launched batch; ``start`` is when the device began it (epoch s).
    ``report_stats``: the model's own measurements go into the result (benchmarks)."""
    batch = started.batch
    assert isinstance(batch, WorkBatch)
    if started.job is None:
        if started.unavailable is not None:
            return _unavailable(batch, started.unavailable, start)
        return WorkResult(batch.batch_id, None, started.error, start, time.time())
    ref = ModelRef(batch.model, batch.version)
    try:
        model = holder.models[ref]
        outputs = model.finish(started.job)
        if len(outputs) != len(batch.inputs):
            raise RuntimeError(f"model returned {len(outputs)} outputs for {len(batch.inputs)}")
        stats = started.job.stats if report_stats else None
        return WorkResult(batch.batch_id, outputs, None, start, time.time(), stats)
    except ModelUnavailable as exc:
        log.warning("batch %s handed back: %s", batch.batch_id, exc)
        return _unavailable(batch, exc, start)
    except Exception as exc:
        log.warning("batch %s failed: %s", batch.batch_id, exc)
        return WorkResult(batch.batch_id, None, _describe(exc), start, time.time())
    finally:
        holder.end(ref)


class _Shutdown:
    """SIGTERM/SIGINT: exit now when idle, after the batches it launched when busy."""

    def __init__(self) -> None:
        self.busy = False  # a batch is launched and its result not yet sent
        self.requested = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        if not self.busy:
            raise SystemExit(0)


def _spawned_by_scheduler(settings: WorkerSettings) -> bool:
    return settings.worker_parent_pid == os.getppid()


def _die_with_parent() -> None:
    """PR_SET_PDEATHSIG: the kernel SIGKILLs us when the spawning scheduler dies."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError) as exc:
        log.warning("cannot tie the worker's life to its scheduler: %s", exc)
        return
    if os.getppid() != parent:  # it died before we asked
        raise SystemExit(0)


def authkey_for(settings: WorkerSettings, socket_path: str) -> bytes:
    """The key a worker proves itself with: ``worker_authkey`` (hex, set by the scheduler
    that spawns it) when set, else the one the scheduler left beside its socket (a worker
    started by hand)."""
    key_hex = settings.worker_authkey
    return (
        bytes.fromhex(key_hex)
        if key_hex
        else (Path(socket_path).parent / "worker.key").read_bytes()
    )


def worker_class(settings: WorkerSettings) -> str:
    """The class whose cost curves this worker's batches teach (heterogeneous pools)."""
    if settings.worker_class:
        return settings.worker_class
    device = settings.cuda_visible_devices.strip()
    return "cpu" if device in ("", "cpu", "-1") else "cuda"


def serve(
    settings: Settings,
    schedulers: list[tuple[str, bytes]],
    model_names: list[str],
    worker_id: str | None = None,
    *,
    preload: bool = True,
    redial: bool = False,
) -> None:
    """Serve every scheduler in ``schedulers`` (socket path, key). One worker per GPU may
    serve several scheduler processes of the host (decision 0014): their batches run on
    the one device in the order they arrive.

    ``model_names`` are the models it may serve; with ``preload`` it loads and warms up
    their built-in versions before it connects (a worker that serves alone), else it
    waits for its schedulers to say which versions to load (the registry's).

    With ``redial`` (a worker that a host supervisor keeps, ``gristmill host``) a
    scheduler that goes away is dialled again until it is back, and the worker keeps
    serving the others meanwhile; without it the worker exits with its last scheduler."""
    shutdown = _Shutdown()
    tracing.setup(settings, "gristmill-worker")
    if _spawned_by_scheduler(settings):
        _die_with_parent()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        shutdown.install()
    locks: dict[Connection, threading.Lock] = {}

    def send(conn: Connection, msg: WorkResult | GenStepResult | ModelStatus) -> None:
        with locks[conn]:
            conn.send(msg)

    holder = Holder(settings, send)
    if preload:
        for record in boot_records(settings, model_names):
            holder.add(load_record(record, settings))
    wid = worker_id or f"{socket.gethostname()}-{os.getpid()}"

    def dial(path: str, authkey: bytes) -> Connection:
        """Join one scheduler: the hello names what this worker holds now."""
        conn = Client(path, family="AF_UNIX", authkey=authkey)
        locks[conn] = threading.Lock()
        conn.send(
            Hello(
                worker_id=wid,
                pid=os.getpid(),
                device=settings.cuda_visible_devices,
                models=list(holder.infos.values()),
                worker_class=worker_class(settings),
                memory_budget_bytes=settings.worker_memory_mb * 1_000_000,
                accepts=tuple(sorted({n.partition("@")[0] for n in model_names})),
            )
        )
        return conn

    paths = {}
    conns = []
    for path, authkey in schedulers:
        conn = dial(path, authkey)
        paths[conn] = path
        conns.append(conn)
    holder.attach(conns)

    def dial_again(lost: Connection) -> Connection | None:
        """A restarted scheduler listens on the same path with a new key (read again)."""
        # The lost connection's lock stays: the finisher may still try a send on it.
        path = paths.pop(lost)
        while not shutdown.requested:
            try:
                conn = dial(path, authkey_for(settings, path))
            except (OSError, EOFError, ValueError):  # not listening yet, or key not written
                time.sleep(REDIAL_S)
                continue
            paths[conn] = path
            holder.attach([conn])
            log.info("worker %s joined the scheduler at %s again", wid, path)
            return conn
        return None

    threading.Thread(target=holder.run, name="loader", daemon=True).start()
    try:
        _serve_batches(
            conns,
            holder,
            shutdown,
            wid,
            settings.worker_stats,
            send,
            DeviceSampler(settings.cuda_visible_devices),
            dial_again if redial else None,
            max_launched=settings.worker_max_launched,
        )
    finally:
        holder.stop()


def _serve_batches(
    conns: list[Connection],
    holder: Holder,
    shutdown: _Shutdown,
    wid: str,
    report_stats: bool,
    send: Callable[[Connection, WorkResult | GenStepResult | ModelStatus], None],
    gpu: DeviceSampler | None = None,
    redial: Callable[[Connection], Connection | None] | None = None,
    *,
    max_launched: int = 3,
) -> None:
    """Read batches in a thread per scheduler, launch them here in arrival order, finish
    them and send each result to its scheduler in a second thread. ``redial``: a lost
    scheduler's reader waits for it to come back instead of ending."""
    # The finisher must get the GIL as soon as the device is done, even while this
    # thread packs the next batch (Python's default switch interval is 5 ms).
    sys.setswitchinterval(min(sys.getswitchinterval(), 0.0005))
    # Per scheduler: (batch, what the batch's Model.prepare started as it arrived), the
    # most urgent scheduler's next first (workers/ready.py).
    incoming: ReadyQueue[Connection] = ReadyQueue()
    launched: queue.Queue[_Started | None] = queue.Queue()
    # Batches launched and not yet finished: the running one and those queued behind it.
    # One scheduler sends at most two at a time (decision 0012; a third of sync requests
    # when both are job batches, decision 76); a worker serving several
    # (decision 0014) keeps one more on the device by default, so that a late launch (its
    # threads share one GIL) does not leave the GPU idle.
    slots = threading.Semaphore(max_launched)
    unsent = [0]  # launched batches whose result is not sent yet
    sent = threading.Condition()
    serving = set(conns)  # schedulers still there (guarded by ``sent``)

    def reader(conn: Connection) -> None:
        while not shutdown.requested:  # once stopping, what is queued goes back unrun
            try:
                if not conn.poll(0.2):
                    continue
                msg = conn.recv()
            except (EOFError, OSError):
                msg = None
            received_at = time.time()  # before its texts are handed to the tokenizer
            if isinstance(msg, ModelCommand):
                holder.command(conn, msg)  # the loader thread carries it out
                continue
            batch: WorkBatch | GenStep | None = msg
            # Tokenizing starts now, while the batches queued ahead of this one compute.
            ahead = prepare_batch(holder, batch) if isinstance(batch, WorkBatch) else None
            # None: that scheduler went away or stops us (seen at once: no deadline is
            # earlier). A step of generation is due as it comes.
            due = batch.deadline if isinstance(batch, WorkBatch) else -math.inf
            if isinstance(batch, GenStep):
                due = time.time()
            incoming.put(conn, (batch, ahead, received_at), due)
            if batch is None:
                holder.forget(conn)
                again = redial(conn) if redial is not None else None
                if again is None:
                    return
                with sent:
                    serving.add(again)
                conn = again

    def finisher() -> None:
        prev_end = 0.0
        while (started := launched.get()) is not None:
            result: WorkResult | GenStepResult
            if started.step is not None:
                result = started.step
            else:
                # It began on the device when the batch before it ended, if that was later.
                result = finish_batch(
                    holder, started, max(started.launched_at, prev_end), report_stats
                )
            prev_end = result.compute_end
            result.device = gpu.sample() if gpu is not None else None
            if isinstance(result, WorkResult):
                result.received_at, result.launched_at = started.received_at, started.launched_at
            if isinstance(started.batch, WorkBatch) and isinstance(result, WorkResult):
                worker_tracing.computed(started.batch, result)
            slots.release()
            try:
                send(started.to, result)
            except OSError:
                with sent:
                    serving.discard(started.to)
                    left = len(serving)
                log.info("a scheduler went away mid-batch; %d left for worker %s", left, wid)
                if not left and redial is None:
                    os._exit(0)
            with sent:
                unsent[0] -= 1
                shutdown.busy = unsent[0] > 0
                sent.notify_all()

    t = threading.Thread(target=finisher, name="finish", daemon=True)
    t.start()
    for i, c in enumerate(conns):
        threading.Thread(target=reader, args=(c,), name=f"read-{i}", daemon=True).start()
    try:
        while True:
            got = incoming.get(0.2)
            if got is None:
                if shutdown.requested and not shutdown.busy:
                    log.info("worker %s finished its batches and exits on request", wid)
                    return
                continue
            conn, (batch, ahead, received_at) = got
            with sent:
                if batch is None:
                    serving.discard(conn)
                    _forget(holder.models, conn)
                if not serving and redial is None:
                    log.info("no scheduler left; worker %s exits", wid)
                    return
                if batch is None or conn not in serving or shutdown.requested:
                    continue  # not launched: that scheduler hands it back
            slots.acquire()
            with sent:
                unsent[0] += 1
                shutdown.busy = True
            if isinstance(batch, GenStep):
                started = run_step(holder.models, batch, conn)
            else:
                started = launch_batch(holder, batch, conn, ahead)
                started.received_at = received_at
            launched.put(started)
            if started.job is None or not started.job.computing():
                with sent:  # computed already: its result goes out before the next starts
                    sent.wait_for(lambda: unsent[0] == 0)
    finally:
        launched.put(None)
        t.join()
