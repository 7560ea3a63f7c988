"""Which versions this scheduler's workers hold and take batches of. Decisions only: the
service reads the registry, carries the commands to the workers and reports readiness.

In: the registry's records (every second), each worker's hello and status messages,
and what the dispatch core says through its interface (the versions in demand, each
worker's batches in flight). Out:
  * ``LoadModel``/``UnloadModel`` per worker, from the residency policy
    (scheduler/core/residency.py): the live version and the canary of every model served
    here, versions with queued requests, the rollback target, then staged versions
    where room is free;
  * the versions each worker takes batches of (``DispatchCore.set_served``): loaded,
    ready, still wanted, and not being drained. A version that leaves (retired, or
    unloaded for room) first gets no new batch, then is unloaded once nothing of it is
    in flight;
  * readiness per version (ready, loading, unavailable, failed) for the API, which
    answers 503 with Retry-After only when no worker can serve.

Not thread-safe: the runtime calls it under the core's lock (scheduler/runtime/host.py).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from core.config import Settings
from core.models.catalog import specs_by_name
from core.models.readiness import Readiness
from core.models.registry import (
    RecordError,
    VersionRecord,
    VersionState,
    builtin_records,
    parse_ref,
    spec_from_record,
)
from core.models.spec import ModelSpec
from core.protocol import (
    LoadModel,
    ModelCommand,
    ModelInfo,
    ModelState,
    ModelStatus,
    UnloadModel,
    info_matches,
)
from core.vocab import ModelRef
from scheduler.core.interface import SchedulerInterface
from scheduler.core.plans import Worker
from scheduler.core.residency import Plan, Rank, Resident, Want, WorkerView, plan
from scheduler.core.stats import WorkerStats

log = logging.getLogger(__name__)


class Commandable(Protocol):
    """A worker connection (scheduler/runtime/workerpool.py ``WorkerHandle``)."""

    @property
    def worker_id(self) -> str: ...


@dataclass
class Held:
    """One worker as the model control sees it."""

    handle: Commandable
    worker: Worker  # the dispatch core's handle for it
    budget: int  # bytes; 0: no limit
    accepts: frozenset[str]  # model names; empty: any
    infos: dict[ModelRef, ModelInfo] = field(default_factory=dict)  # loaded
    states: dict[ModelRef, ModelState] = field(default_factory=dict)
    loaded_at: dict[ModelRef, float] = field(default_factory=dict)
    loading: Want | None = None
    failed: dict[ModelRef, tuple[float, str]] = field(default_factory=dict)  # at, why
    unavailable: dict[ModelRef, tuple[str | None, float | None]] = field(default_factory=dict)
    draining: set[ModelRef] = field(default_factory=set)  # unloads once nothing is in flight

    def takes(self, name: str) -> bool:
        return not self.accepts or name in self.accepts


class ModelControl:
    def __init__(self, settings: Settings, served: Iterable[str], core: SchedulerInterface):
        self.settings = settings
        self.core = core
        self.names: set[str] = set()
        self.pinned: set[ModelRef] = set()  # name@version on the command line
        for ref in served:
            name, version = parse_ref(ref)
            self.names.add(name)
            if version:
                self.pinned.add(ModelRef(name, version))
        # Until the registry is read: the built-in versions.
        self.records: dict[ModelRef, VersionRecord] = {}
        self.previous_live: dict[str, str] = {}
        self.specs: dict[str, dict[str, ModelSpec]] = {}
        self.set_registry(builtin_records(settings), {})
        self.registry_read = False
        self.held: dict[int, Held] = {}  # by id() of the worker's handle
        self.measured: dict[ModelRef, int] = {}  # bytes a loaded version held

    # ---- inputs ------------------------------------------------------------------------
    def set_registry(
        self, records: Iterable[VersionRecord], previous_live: Mapping[str, str]
    ) -> None:
        usable: dict[ModelRef, VersionRecord] = {}
        for r in records:
            try:
                spec_from_record(r, self.settings)
            except RecordError as exc:
                log.error("registry row %s is unusable: %s", r.ref, exc)
                continue
            usable[ModelRef(r.name, r.version)] = r
        self.records = usable
        self.previous_live = dict(previous_live)
        # Every known version's spec: intake keys batches by the parameters it declares.
        self.specs = specs_by_name(usable.values(), self.settings)
        self.registry_read = True

    def add_worker(
        self,
        handle: Commandable,
        worker: Worker,
        budget: int,
        accepts: Iterable[str],
        infos: Iterable[ModelInfo],
        now: float,
    ) -> None:
        h = Held(handle, worker, budget, frozenset(accepts))
        for info in infos:
            ref = ModelRef(info.name, info.version)
            h.infos[ref] = info
            h.states[ref] = ModelState.READY
            h.loaded_at[ref] = now
            self.measured[ref] = info.memory_bytes or self.measured.get(ref, 0)
        self.held[id(handle)] = h

    def on_status(self, handle: Commandable, s: ModelStatus, now: float) -> None:
        h = self.held.get(id(handle))
        if h is None:
            return
        ref = ModelRef(s.name, s.version)
        if s.state is ModelState.LOADING:
            if h.loading is None or h.loading.ref != ref:
                h.loading = Want(ref, Rank.DEMANDED, self._bytes(ref))
            return
        if h.loading is not None and h.loading.ref == ref:
            h.loading = None
        if s.state in (ModelState.READY, ModelState.UNAVAILABLE):
            if s.info is not None:
                h.infos[ref] = s.info
                self.measured[ref] = s.info.memory_bytes or self.measured.get(ref, 0)
            h.loaded_at.setdefault(ref, now)
            h.states[ref] = s.state
            h.failed.pop(ref, None)
            h.draining.discard(ref)  # loaded again after an unload was asked for
            if s.state is ModelState.UNAVAILABLE:
                h.unavailable[ref] = (s.error, s.retry_after_s)
                log.warning("%s unavailable on %s: %s", ref.label(), handle.worker_id, s.error)
            else:
                h.unavailable.pop(ref, None)
        elif s.state is ModelState.FAILED:
            h.failed[ref] = (now, s.error or "failed to load")
            log.error("%s failed to load on %s: %s", ref.label(), handle.worker_id, s.error)
        elif s.state is ModelState.UNLOADED:
            for d in (h.infos, h.states, h.loaded_at, h.unavailable):
                d.pop(ref, None)
            h.draining.discard(ref)

    # ---- decisions ---------------------------------------------------------------------
    def _bytes(self, ref: ModelRef) -> int:
        r = self.records.get(ref)
        return self.measured.get(ref) or (r.memory_bytes if r is not None else 0)

    def wants(self) -> list[Want]:
        """What this scheduler wants loaded somewhere, best rank per version."""
        ranks: dict[ModelRef, Rank] = {}

        def want(ref: ModelRef, rank: Rank) -> None:
            if ref in self.records and (ref not in ranks or rank < ranks[ref]):
                ranks[ref] = rank

        for ref, r in self.records.items():
            if r.name not in self.names:
                continue
            pinned = ref in self.pinned and r.state is not VersionState.RETIRED
            if pinned or r.state in (VersionState.LIVE, VersionState.CANARY):
                want(ref, Rank.REQUIRED)
            elif r.state is VersionState.STAGED:
                prev = self.previous_live.get(r.name)
                want(ref, Rank.WARM if prev == r.version else Rank.SPARE)
        for ref in self.core.demanded():
            if ref.model in self.names:
                want(ref, Rank.DEMANDED)
        return [Want(ref, rank, self._bytes(ref)) for ref, rank in ranks.items()]

    def tick(self, now: float) -> list[tuple[Commandable, ModelCommand]]:
        """Commands for the workers, and what each takes batches of from now on."""
        seen = {k: self.core.worker_stats(h.worker) for k, h in self.held.items()}
        for key in [k for k, st in seen.items() if not st.alive]:
            del self.held[key]
        wants = self.wants()
        out: list[tuple[Commandable, ModelCommand]] = []
        for key, h in self.held.items():
            mine = [w for w in wants if h.takes(w.ref[0])]
            out += self._tick_worker(h, seen[key], mine, now)
        return out

    def _tick_worker(
        self, h: Held, st: WorkerStats, wants: list[Want], now: float
    ) -> list[tuple[Commandable, ModelCommand]]:
        out: list[tuple[Commandable, ModelCommand]] = []
        busy = st.busy
        # A version loaded from another build than the registry's (a worker that booted
        # with the built-in one): load the registry's over it.
        for ref, info in list(h.infos.items()):
            record = self.records.get(ref)
            if (
                record is not None
                and not info_matches(record, info)
                and h.loading is None
                and ref not in busy
            ):
                h.loading = Want(ref, Rank.REQUIRED, self._bytes(ref))
                out.append((h.handle, LoadModel(record)))
        resident = {
            ref: Resident(
                ref,
                h.infos[ref].memory_bytes or self._bytes(ref),
                h.loaded_at.get(ref, now),
                st.used_at.get(ref, h.loaded_at.get(ref, now)),
                ref in busy,
            )
            for ref in h.infos
            if ref not in h.draining
        }
        view = WorkerView(
            h.budget,
            resident,
            h.loading,
            {ref: at for ref, (at, _) in h.failed.items()},
        )
        p: Plan = plan(view, wants, now, self.settings.model_min_residency_s)
        for ref in p.unload:
            if ref not in h.draining:
                log.info("draining %s on %s (%s)", ref.label(), h.handle.worker_id, p.why)
            h.draining.add(ref)
        # A drained version goes once nothing of it is in flight on the worker (before
        # any load: the worker frees its memory first).
        for ref in sorted(h.draining):
            if ref not in busy and h.states.get(ref) is not None:
                out.append((h.handle, UnloadModel(*ref)))
                h.states.pop(ref)
        if p.load is not None:
            record = self.records[p.load]
            h.loading = next(w for w in wants if w.ref == p.load)
            log.info("loading %s on %s (%s)", p.load.label(), h.handle.worker_id, p.why)
            out.append((h.handle, LoadModel(record)))
        wanted = {w.ref for w in wants}
        served = [
            info
            for ref, info in h.infos.items()
            if h.states.get(ref) is ModelState.READY
            and ref in wanted
            and ref not in h.draining
            and info_matches(self.records[ref], info)
        ]
        self.core.set_served(h.worker, served)
        return out

    # ---- what the API is told ----------------------------------------------------------
    def readiness(self) -> list[Readiness]:
        by_ref: dict[ModelRef, Counter[ModelState]] = {}
        errors: dict[ModelRef, str] = {}
        retry: dict[ModelRef, float] = {}
        for h in self.held.values():
            served = self.core.worker_stats(h.worker).serving
            for ref in set(h.infos) | set(h.failed) | ({h.loading.ref} if h.loading else set()):
                c = by_ref.setdefault(ref, Counter())
                if h.loading is not None and h.loading.ref == ref:
                    c[ModelState.LOADING] += 1
                elif ref in served:
                    c[ModelState.READY] += 1
                elif h.states.get(ref) is ModelState.UNAVAILABLE:
                    c[ModelState.UNAVAILABLE] += 1
                    why, after = h.unavailable.get(ref, (None, None))
                    if why:
                        errors[ref] = why
                    if after is not None:
                        retry[ref] = min(after, retry.get(ref, after))
                elif ref in h.failed:
                    c[ModelState.FAILED] += 1
                    errors.setdefault(ref, h.failed[ref][1])
        return [
            Readiness(
                ref.model,
                ref.version,
                ready=c[ModelState.READY],
                loading=c[ModelState.LOADING],
                unavailable=c[ModelState.UNAVAILABLE],
                failed=c[ModelState.FAILED],
                error=errors.get(ref),
                retry_after_s=retry.get(ref),
            )
            for ref, c in by_ref.items()
        ]
