"""Which versions a worker should hold, within its memory budget. Pure: the clock is an
argument.

What the scheduler wants loaded comes ranked:

    REQUIRED  the live version and the canary of each model this scheduler serves (and
              versions pinned on its command line)
    DEMANDED  versions with requests queued here (a pinned request, a replay, the last
              requests of a retired version draining)
    WARM      the rollback target (the version live before the last promote), so a
              rollback finds it loaded
    SPARE     other staged versions: loaded only into room that is free

One load at a time per worker. The best-ranked version it lacks is loaded when it fits
in the budget; else versions are unloaded to make room, least recently used first,
among those that rank no better, have nothing in flight on the worker, and have been
resident at least ``min_residency_s`` (a load costs seconds: two versions taking turns
must not spend the worker on loading). A version nobody wants any more (retired and
drained, or no longer this scheduler's) is unloaded as soon as nothing of it is in
flight, residency or not. A version that failed to load is tried again after
``FAILED_RETRY_S``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from core.vocab import ModelRef

# A version whose load failed (a sha256 mismatch, a missing file, no room on the device)
# is tried again after this long (s): long enough not to spend the worker on a version
# that keeps failing, short enough that a fixed artifact is picked up within a minute.
FAILED_RETRY_S = 30.0


class Rank(IntEnum):
    REQUIRED = 0
    DEMANDED = 1
    WARM = 2
    SPARE = 3


@dataclass(frozen=True)
class Want:
    ref: ModelRef
    rank: Rank
    bytes: int = 0  # what it will hold (measured on a worker before, else estimated)


@dataclass(frozen=True)
class Resident:
    ref: ModelRef
    bytes: int
    loaded_at: float
    last_used: float
    busy: bool = False  # batches of it are on the worker


@dataclass(frozen=True)
class WorkerView:
    budget: int  # bytes its versions may hold together; 0: no limit
    resident: Mapping[ModelRef, Resident] = field(default_factory=dict)
    loading: Want | None = None
    failed_at: Mapping[ModelRef, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    load: ModelRef | None = None
    unload: tuple[ModelRef, ...] = ()
    why: str = ""


def plan(view: WorkerView, wants: Sequence[Want], now: float, min_residency_s: float) -> Plan:
    wanted = {w.ref: w for w in wants}
    # Nobody wants these: drained, they go now.
    gone = tuple(r.ref for r in view.resident.values() if r.ref not in wanted and not r.busy)
    if view.loading is not None:
        return Plan(None, gone, f"loading {view.loading.ref.label()}")
    missing = sorted(
        (
            w
            for w in wants
            if w.ref not in view.resident
            and now - view.failed_at.get(w.ref, -float("inf")) >= FAILED_RETRY_S
        ),
        key=lambda w: w.rank,
    )
    for want in missing:
        kept = {ref: r for ref, r in view.resident.items() if ref not in gone}
        used = sum(r.bytes for r in kept.values())
        if not view.budget or used + want.bytes <= view.budget:
            return Plan(want.ref, gone, f"{want.rank.name.lower()}: fits")
        if want.rank is Rank.SPARE:
            continue  # only into free room
        victims = evictable(kept, wanted, want, now, min_residency_s)
        freed = 0
        chosen: list[ModelRef] = []
        for r in victims:
            if used - freed + want.bytes <= view.budget:
                break
            chosen.append(r.ref)
            freed += r.bytes
        if used - freed + want.bytes <= view.budget:
            return Plan(
                want.ref,
                gone + tuple(chosen),
                f"{want.rank.name.lower()}: unloads {', '.join(r.label() for r in chosen)}",
            )
    return Plan(None, gone, "nothing to load" if not missing else "no room")


def evictable(
    resident: Mapping[ModelRef, Resident],
    wanted: Mapping[ModelRef, Want],
    incoming: Want,
    now: float,
    min_residency_s: float,
) -> list[Resident]:
    """Residents that may make room for ``incoming``, least recently used first."""
    out = []
    for r in resident.values():
        w = wanted.get(r.ref)
        if r.busy or w is None:
            continue  # busy ones finish first; unwanted ones are unloaded already
        if w.rank < incoming.rank:
            continue
        if now - r.loaded_at < min_residency_s:
            continue
        out.append(r)
    return sorted(out, key=lambda r: (r.last_used, -w_rank(wanted, r)))


def w_rank(wanted: Mapping[ModelRef, Want], r: Resident) -> int:
    return int(wanted[r.ref].rank)
