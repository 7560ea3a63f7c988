"""The versions one worker holds, and the loading and unloading its schedulers ask for.

A scheduler sends ``LoadModel`` (a registry record) and ``UnloadModel`` between
batches; a loader thread here carries them out one at a time, beside the batches that
keep running: verify the artifact's sha256, load, warm up, then tell every scheduler
this worker serves (``ModelStatus``: loading, ready with what it measured, or failed
with why). A version stays while any scheduler wants it; once none does and none of
its batches is unfinished, it is closed and its memory freed.

Thread-safe: reader threads queue commands, the main and finisher threads look models
up and count their batches, the loader thread changes the set.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from multiprocessing.connection import Connection

from core.config import Settings
from core.models.registry import VersionRecord
from core.protocol import (
    LoadModel,
    ModelCommand,
    ModelInfo,
    ModelState,
    ModelStatus,
    UnloadModel,
    info_matches,
)
from core.redact import redact
from core.vocab import ModelRef
from workers.models.base import Model
from workers.models.loader import Loaded, load_record

log = logging.getLogger(__name__)

# How often an unload waiting for its last batches looks again (s).
DRAIN_POLL_S = 0.05


def _describe(exc: BaseException) -> str:
    # Reported to the scheduler and kept in the registry's readiness for operators: an
    # artifact's or upstream's URL may carry a password.
    return redact("".join(traceback.format_exception_only(type(exc), exc)).strip())


class Holder:
    def __init__(
        self,
        settings: Settings,
        send: Callable[[Connection, ModelStatus], None],
        *,
        load: Callable[[VersionRecord, Settings], Loaded] = load_record,
    ):
        self.settings = settings
        self._send = send  # to one scheduler (the caller serializes sends per connection)
        self._load = load
        self.models: dict[ModelRef, Model] = {}  # read without the lock (dict reads are atomic)
        self.infos: dict[ModelRef, ModelInfo] = {}
        self._wants: dict[Connection, set[ModelRef]] = {}
        # Schedulers that went away: a load they queued before leaving is not carried out
        # (it would make a closed connection hold the version for good).
        self._gone: set[Connection] = set()
        self._inflight: Counter[ModelRef] = Counter()
        self._lock = threading.Lock()
        self._commands: queue.Queue[tuple[Connection, ModelCommand] | None] = queue.Queue()
        self._status: dict[ModelRef, ModelStatus] = {}

    # ---- boot ----------------------------------------------------------------------------
    def add(self, loaded: Loaded) -> None:
        """A version loaded before any scheduler is connected (the boot set)."""
        ref = ModelRef(loaded.info.name, loaded.info.version)
        self._install(ref, loaded)

    def attach(self, conns: list[Connection]) -> None:
        """Schedulers this worker serves; the boot set counts as wanted by each."""
        with self._lock:
            for c in conns:
                self._wants[c] = set(self.models)

    # ---- what batch threads call ---------------------------------------------------------
    def begin(self, ref: ModelRef) -> Model | None:
        with self._lock:
            model = self.models.get(ref)
            if model is not None:
                self._inflight[ref] += 1
            return model

    def end(self, ref: ModelRef) -> None:
        with self._lock:
            self._inflight[ref] -= 1

    # ---- what reader threads call --------------------------------------------------------
    def command(self, conn: Connection, msg: ModelCommand) -> None:
        self._commands.put((conn, msg))

    def forget(self, conn: Connection) -> None:
        """That scheduler went away: it wants nothing any more."""
        with self._lock:
            gone = self._wants.pop(conn, set())
            self._gone.add(conn)
        for ref in gone:
            self._commands.put((conn, UnloadModel(*ref)))

    def stop(self) -> None:
        self._commands.put(None)

    # ---- the loader thread ---------------------------------------------------------------
    def run(self) -> None:
        while (item := self._commands.get()) is not None:
            conn, msg = item
            try:
                if isinstance(msg, LoadModel):
                    self._on_load(conn, msg.record)
                else:
                    self._on_unload(conn, ModelRef(msg.name, msg.version))
            except Exception as exc:  # a bug here must not kill the worker's batches
                log.exception("model command %r failed: %s", msg, exc)

    def _on_load(self, conn: Connection, record: VersionRecord) -> None:
        ref = ModelRef(record.name, record.version)
        with self._lock:
            if conn in self._gone:
                return
            self._wants.setdefault(conn, set()).add(ref)
            info = self.infos.get(ref)
        if info is not None and info_matches(record, info):
            status = self._status.get(ref) or ModelStatus(*ref, ModelState.READY, info)
            self._reply(conn, status)
            return
        if info is not None:  # another build of the same version: replace it
            self._unload(ref)
        self._broadcast(ModelStatus(*ref, ModelState.LOADING))
        t0 = time.monotonic()
        try:
            loaded = self._load(record, self.settings)
        except Exception as exc:
            log.error("model %s failed to load: %s", record.ref, _describe(exc))
            self._broadcast(ModelStatus(*ref, ModelState.FAILED, error=_describe(exc)))
            return
        self._install(ref, loaded)
        log.info("model %s loaded in %.1f s", record.ref, time.monotonic() - t0)
        model = loaded.model
        state = ModelState.READY if model.available() else ModelState.UNAVAILABLE
        self._broadcast(ModelStatus(*ref, state, loaded.info))

    def _install(self, ref: ModelRef, loaded: Loaded) -> None:
        def listener(state: ModelState, error: str | None, retry_after_s: float | None) -> None:
            why = None if error is None else redact(error)  # an upstream URL's password
            self._broadcast(ModelStatus(*ref, state, loaded.info, why, retry_after_s))

        loaded.model.status_listener = listener
        with self._lock:
            self.models[ref] = loaded.model
            self.infos[ref] = loaded.info
        self._status[ref] = ModelStatus(*ref, ModelState.READY, loaded.info)

    def _on_unload(self, conn: Connection, ref: ModelRef) -> None:
        with self._lock:
            self._wants.get(conn, set()).discard(ref)
            wanted = any(ref in w for w in self._wants.values())
        if not wanted:
            self._unload(ref)

    def _unload(self, ref: ModelRef) -> None:
        while True:  # its batches finish first (the scheduler drained it before asking)
            with self._lock:
                if self._inflight[ref] <= 0:
                    model = self.models.pop(ref, None)
                    self.infos.pop(ref, None)
                    break
            time.sleep(DRAIN_POLL_S)
        self._status.pop(ref, None)
        if model is None:
            return
        model.close()
        log.info("model %s@%s unloaded", *ref)
        self._broadcast(ModelStatus(*ref, ModelState.UNLOADED))

    # ---- telling the schedulers ----------------------------------------------------------
    def _reply(self, conn: Connection, status: ModelStatus) -> None:
        with contextlib.suppress(OSError):  # that scheduler is gone; its reader notices
            self._send(conn, status)

    def _broadcast(self, status: ModelStatus) -> None:
        ref = ModelRef(status.name, status.version)
        if status.state in (ModelState.READY, ModelState.UNAVAILABLE):
            self._status[ref] = status
        with self._lock:
            conns = list(self._wants)
        for c in conns:
            self._reply(c, status)
