"""Which versions of the generation model its worker holds, and which it should (decision
67). Pure: the registry's records, the worker's hello and status messages and the
versions that have requests here go in; ``LoadModel``/``UnloadModel`` commands and each
version's readiness come out. The runtime (scheduler/runtime/generation/engine.py)
carries the commands to the worker and reports the readiness for the API.

The worker holds every open version (staged, canary, live: not retired), so a promote
or a rollback moves traffic between versions that are already loaded and takes effect
as soon as the API reads the registry; a staged version serves pinned requests and
replays. A retired version stays while requests for it are here, then is unloaded.
Every version runs under the one continuous-batching policy and its KV pool plan: a
version whose pool (blocks, block size, context) differs from the one the policy was
sized from is not served (failed, with the reason), as is one that failed to load
(tried again after ``RETRY_FAILED_S``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from core.models.readiness import Readiness
from core.models.registry import VersionRecord, VersionState
from core.protocol import (
    GenerationInfo,
    LoadModel,
    ModelCommand,
    ModelInfo,
    ModelState,
    ModelStatus,
    UnloadModel,
    info_matches,
)

# A version that failed to load is asked for again after this long (s), as the batching
# workers' residency does (docs/models.md).
RETRY_FAILED_S = 30.0


class Fate(StrEnum):
    JOIN = "join"
    FAIL = "fail"
    EXPIRE = "expire"
    WAIT = "wait"


@dataclass
class Slot:
    """One version on the worker."""

    state: ModelState
    info: ModelInfo | None = None
    error: str | None = None
    at: float = 0.0  # when it failed (for the retry)


@dataclass
class Versions:
    name: str
    records: dict[str, VersionRecord] = field(default_factory=dict)  # every state
    held: dict[str, Slot] = field(default_factory=dict)
    pool: GenerationInfo | None = None  # what the policy was sized from

    # ---- inputs --------------------------------------------------------------------
    def set_registry(self, records: Iterable[VersionRecord]) -> None:
        self.records = {r.version: r for r in records if r.name == self.name}

    def on_hello(self, infos: Iterable[ModelInfo]) -> None:
        """A (new) worker: it holds what its hello names, nothing else."""
        self.held = {
            i.version: self._checked(Slot(ModelState.READY, i))
            for i in infos
            if i.name == self.name
        }

    def on_status(self, s: ModelStatus, now: float) -> None:
        if s.name != self.name:
            return
        if s.state is ModelState.UNLOADED:
            self.held.pop(s.version, None)
        elif s.state is ModelState.FAILED:
            self.held[s.version] = Slot(ModelState.FAILED, None, s.error or "failed", now)
        else:
            prev = self.held.get(s.version)
            info = s.info if s.info is not None else (prev.info if prev else None)
            self.held[s.version] = self._checked(Slot(s.state, info, s.error), now)

    def _checked(self, slot: Slot, now: float = 0.0) -> Slot:
        """A loaded version whose KV pool differs from the policy's cannot run under it."""
        gen = slot.info.generation if slot.info is not None else None
        if slot.state is not ModelState.READY or self.pool is None or gen is None:
            return slot
        p = self.pool
        if (
            gen.block_size != p.block_size
            or gen.max_model_len != p.max_model_len
            or gen.num_blocks < p.num_blocks
        ):
            why = (
                f"its KV pool ({gen.num_blocks} blocks of {gen.block_size}, context "
                f"{gen.max_model_len}) differs from the running policy's ({p.num_blocks} of "
                f"{p.block_size}, context {p.max_model_len}): versions must share the shape"
            )
            return Slot(ModelState.FAILED, slot.info, why, now)
        return slot

    # ---- decisions -----------------------------------------------------------------
    def wanted(self, busy: Iterable[str]) -> set[str]:
        """Open versions, and any known version that still has requests here."""
        out = {v for v, r in self.records.items() if r.state is not VersionState.RETIRED}
        return out | {v for v in busy if v in self.records}

    def tick(self, now: float, busy: Iterable[str]) -> list[ModelCommand]:
        busy = set(busy)
        want = self.wanted(busy)
        out: list[ModelCommand] = []
        for v in sorted(want):
            record = self.records[v]
            slot = self.held.get(v)
            if slot is None or (
                slot.state is ModelState.FAILED and now - slot.at >= RETRY_FAILED_S
            ):
                self.held[v] = Slot(ModelState.LOADING)
                out.append(LoadModel(record))
            elif (
                slot.state is ModelState.READY
                and slot.info is not None
                and not info_matches(record, slot.info)
                and v not in busy
            ):  # the worker booted with another build of it: load the registry's
                self.held[v] = Slot(ModelState.LOADING)
                out.append(LoadModel(record))
        for v, slot in list(self.held.items()):
            if v not in want and v not in busy and slot.state is not ModelState.LOADING:
                del self.held[v]
                out.append(UnloadModel(self.name, v))
        return out

    def waiting_fate(self, version: str, deadline: float, now: float) -> Fate:
        """What becomes of a request that waits here for ``version``: it joins once the
        version is ready, fails when the version failed to load, expires when its
        first-token deadline passes first (as the policy would expire it), else waits."""
        slot = self.held.get(version)
        if slot is not None and slot.state is ModelState.READY:
            return Fate.JOIN
        if slot is not None and slot.state is ModelState.FAILED:
            return Fate.FAIL
        return Fate.EXPIRE if deadline < now else Fate.WAIT

    def ready(self, version: str) -> bool:
        slot = self.held.get(version)
        return slot is not None and slot.state is ModelState.READY

    def known(self, version: str) -> bool:
        return version in self.records

    def ready_infos(self) -> list[ModelInfo]:
        return [
            s.info
            for v, s in sorted(self.held.items())
            if s.state is ModelState.READY and s.info is not None and v in self.records
        ]

    def readiness(self, alive: bool) -> list[Readiness]:
        """Each version on the worker, for the API. Without a worker (not started yet,
        or lost and being replaced) every open version is loading."""
        if not alive:
            return [Readiness(self.name, v, loading=1) for v in sorted(self.wanted(()))]
        out = []
        for v, s in sorted(self.held.items()):
            out.append(
                Readiness(
                    self.name,
                    v,
                    ready=int(s.state is ModelState.READY),
                    loading=int(s.state is ModelState.LOADING),
                    unavailable=int(s.state is ModelState.UNAVAILABLE),
                    failed=int(s.state is ModelState.FAILED),
                    error=s.error,
                )
            )
        return out
