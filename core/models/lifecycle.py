"""What each lifecycle command does to a model's versions. Pure.

One model's versions and its rollback target go in; the states to write (or a
``Conflict`` naming why not) come out. results/modelregistry.py applies a ``Change``
in one transaction with its audit row, under a lock on the model, so two operators
racing each other see one go first and the other decided against the result.

    register          -> staged
    canary v --share  staged | canary -> canary (one canary per model)
    promote v         staged | canary -> live; the live one -> staged, remembered
                      as the rollback target
    rollback          live -> staged; the rollback target -> live (and it becomes
                      the target: a second rollback undoes the first)
    rollback v        v canary: the canary is withdrawn (-> staged); v live: as above
    retire v          staged | canary -> retired (never the live one)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.errors import Conflict, InvalidInput, NotFound
from core.models.registry import VersionRecord, VersionState

S = VersionState


@dataclass(frozen=True)
class ModelVersions:
    name: str
    versions: Mapping[str, VersionRecord]
    previous_live: str | None = None

    def live(self) -> str | None:
        return next((v for v, r in self.versions.items() if r.state is S.LIVE), None)

    def canary(self) -> str | None:
        return next((v for v, r in self.versions.items() if r.state is S.CANARY), None)

    def get(self, version: str) -> VersionRecord:
        r = self.versions.get(version)
        if r is None:
            known = ", ".join(sorted(self.versions)) or "none"
            raise NotFound(f"no version {self.name}@{version} (registered: {known})", field="model")
        return r


@dataclass(frozen=True)
class Change:
    action: str
    version: str
    states: dict[str, tuple[VersionState, float]]  # version -> (state, canary share)
    previous_live: str | None
    detail: dict[str, Any] = field(default_factory=dict)  # for the audit row


def _share(share: float) -> float:
    if not 0 < share <= 1:
        raise InvalidInput("share must be above 0 and at most 1 (e.g. 0.05 for 5%)", field="share")
    return share


def canary(m: ModelVersions, version: str, share: float) -> Change:
    r = m.get(version)
    share = _share(share)
    if r.state not in (S.STAGED, S.CANARY):
        raise Conflict(f"{r.ref} is {r.state}; only a staged version can become the canary")
    other = m.canary()
    if other is not None and other != version:
        raise Conflict(f"{m.name}@{other} is already the canary; promote it or roll it back first")
    if m.live() is None:
        raise Conflict(f"{m.name} has no live version to compare a canary with; promote one")
    before = r.canary_share if r.state is S.CANARY else 0.0
    return Change(
        "canary",
        version,
        {version: (S.CANARY, share)},
        m.previous_live,
        {"share": share, "share_before": before, "state_before": str(r.state)},
    )


def _neither_live_nor_retired(
    m: ModelVersions, version: str, *, if_live: str, if_retired: str
) -> VersionRecord:
    """The version, unless it is live or retired: then a Conflict giving that reason."""
    r = m.get(version)
    if r.state is S.LIVE:
        raise Conflict(f"{r.ref} {if_live}")
    if r.state is S.RETIRED:
        raise Conflict(f"{r.ref} {if_retired}")
    return r


def promote(m: ModelVersions, version: str) -> Change:
    r = _neither_live_nor_retired(
        m,
        version,
        if_live="is already live",
        if_retired="is retired; register it again under a new version",
    )
    live = m.live()
    states = {version: (S.LIVE, 0.0)}
    if live is not None:
        states[live] = (S.STAGED, 0.0)
    return Change(
        "promote",
        version,
        states,
        live if live is not None else m.previous_live,
        {"from": live, "state_before": str(r.state)},
    )


def rollback(m: ModelVersions, version: str | None = None) -> Change:
    live, can = m.live(), m.canary()
    if version is not None and version != live:
        r = m.get(version)
        if r.state is not S.CANARY:
            raise Conflict(f"{r.ref} is {r.state}: only the live version or the canary rolls back")
        return Change(
            "rollback",
            version,
            {version: (S.STAGED, 0.0)},
            m.previous_live,
            {"withdrawn_canary": version, "share_before": r.canary_share},
        )
    if live is None:
        raise Conflict(f"{m.name} has no live version to roll back")
    target = m.previous_live
    if target is None or target not in m.versions:
        raise Conflict(f"{m.name}@{live} has no earlier live version to roll back to")
    t = m.versions[target]
    if t.state is S.RETIRED:
        raise Conflict(f"the earlier live version {t.ref} was retired; promote another instead")
    states = {live: (S.STAGED, 0.0), target: (S.LIVE, 0.0)}
    detail: dict[str, Any] = {"from": live, "to": target}
    if can == target:
        detail["canary_ended"] = can
    return Change("rollback", live, states, live, detail)


def retire(m: ModelVersions, version: str) -> Change:
    r = _neither_live_nor_retired(
        m,
        version,
        if_live="is live; promote another version or roll back first",
        if_retired="is already retired",
    )
    previous = None if m.previous_live == version else m.previous_live
    return Change(
        "retire", version, {version: (S.RETIRED, 0.0)}, previous, {"state_before": str(r.state)}
    )
