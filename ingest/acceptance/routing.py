"""Which version answers a request. Pure: the registry's view and the request go in,
a version (or the error to answer) comes out.

* ``model@version`` pins: that version, whatever its state, unless it is retired.
* ``model`` goes to the live version, except for callers that fall in the canary's
  share: those go to the canary while some worker can serve it.
* A caller falls in the share by a hash of who it is (its tenant, or its
  Idempotency-Key where the model is configured so) and of the canary version, so it
  sees one version for the canary's whole life, a share raised from 5% to 10% keeps
  the first 5% and adds to them, and each new canary draws a fresh cohort.
* A version no worker can serve is not chosen when another can take the request (a
  canary still loading leaves its share on the live version); a pinned or live
  version that nothing serves is a 503 with Retry-After, from the workers' own
  account: loading (the load's usual time), cut off from its upstream (the circuit's
  time left), failed verification (no retry promised).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from core.errors import NotFound, Unavailable
from core.limits import shown

# What the schedulers' workers report for one version, summed over schedulers (read by
# the catalog; routing reads only its counts, error and Retry-After).
from core.models.readiness import Readiness as Served
from core.models.registry import VersionRecord, VersionState, version_order

# Retry-After for a version some worker is loading (s): an embedding model loads and
# warms up in about 5-15 s on a CPU here; the client's retry then usually lands on it.
LOADING_RETRY_S = 5.0
# Retry-After when no worker reports the version at all (s): the schedulers re-read the
# registry every second and report readiness every second.
UNSERVED_RETRY_S = 5.0

STICKY_TENANT = "tenant"
STICKY_IDEMPOTENCY_KEY = "idempotency_key"


@dataclass(frozen=True)
class ModelRoutes:
    """One model's versions as routing sees them."""

    name: str
    versions: Mapping[str, VersionRecord]
    sticky: str = STICKY_TENANT

    def live(self) -> VersionRecord | None:
        return next((r for r in self.versions.values() if r.state is VersionState.LIVE), None)

    def canary(self) -> VersionRecord | None:
        return next((r for r in self.versions.values() if r.state is VersionState.CANARY), None)


@dataclass(frozen=True)
class Decision:
    version: str
    reason: str  # pinned | live | canary | live (canary not ready)


@dataclass
class RouteTable:
    models: dict[str, ModelRoutes] = field(default_factory=dict)
    served: dict[tuple[str, str], Served] = field(default_factory=dict)

    def names(self) -> list[str]:
        return sorted(
            n
            for n, m in self.models.items()
            if any(r.state is not VersionState.RETIRED for r in m.versions.values())
        )


def bucket(name: str, version: str, who: str) -> float:
    """Where ``who`` falls in [0, 1) for this canary (uniform, stable)."""
    h = hashlib.sha256(f"{name}\x00{version}\x00{who}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def sticky_key(routes: ModelRoutes, tenant_id: str, idempotency_key: str | None) -> str:
    if routes.sticky == STICKY_IDEMPOTENCY_KEY and idempotency_key:
        return f"key\x00{tenant_id}\x00{idempotency_key}"
    return f"tenant\x00{tenant_id}"


def in_canary(routes: ModelRoutes, canary: VersionRecord, who: str) -> bool:
    return bucket(routes.name, canary.version, who) < canary.canary_share


def servable(served: Served | None) -> bool:
    return served is not None and served.ready > 0


def unavailable(ref: str, served: Served | None) -> Unavailable:
    """The 503 for a version nothing can serve now, with the workers' reason in a word:
    their own text (an upstream's URL and answer, an artifact's path) is for operators
    (``gristmill models list``, the admin API), never for every tenant."""
    if served is not None and served.loading:
        return Unavailable(
            f"model {ref} is loading on {served.loading} worker(s); retry shortly",
            retry_after_s=LOADING_RETRY_S,
            reason="model_loading",
        )
    if served is not None and served.unavailable:
        wait = served.retry_after_s if served.retry_after_s is not None else UNSERVED_RETRY_S
        return Unavailable(
            f"model {ref} cannot be reached by its workers right now; retry later",
            retry_after_s=max(1.0, wait),
            reason="upstream_down",
        )
    if served is not None and served.failed:
        return Unavailable(
            f"model {ref} failed to load on its workers and is not served until an operator "
            "fixes or retires it",
            reason="model_failed",
        )
    return Unavailable(
        f"no worker is serving model {ref} right now",
        retry_after_s=UNSERVED_RETRY_S,
        reason="no_live_worker",
    )


def lookup(table: RouteTable, name: str, version: str) -> VersionRecord:
    """The version ``name`` (its live one) or ``name@version`` names, whether or not a
    worker serves it: NotFound naming it when it is unknown or retired."""
    routes = known_routes(table, name)
    if version:
        r = routes.versions.get(version)
        if r is None or r.state is VersionState.RETIRED:
            why = "is retired" if r is not None else "does not exist"
            raise NotFound(
                f"model version {shown(f'{name}@{version}')} {why} "
                f"(versions: {', '.join(open_versions(routes))})",
                field="model",
            )
        return r
    live = routes.live()
    if live is None:
        raise NotFound(
            f"model {name} has no live version; pin one (versions: "
            f"{', '.join(sorted(routes.versions, key=version_order))})",
            field="model",
        )
    return live


def known_routes(table: RouteTable, name: str) -> ModelRoutes:
    """A model with a version that is not retired; NotFound naming it otherwise."""
    routes = table.models.get(name)
    if routes is None or all(r.state is VersionState.RETIRED for r in routes.versions.values()):
        raise NotFound(
            f"unknown model {shown(name)} (available: {', '.join(table.names()) or 'none'})",
            field="model",
        )
    return routes


def open_versions(routes: ModelRoutes) -> list[str]:
    """Its versions that are not retired, in version order."""
    return sorted(
        (v for v, x in routes.versions.items() if x.state is not VersionState.RETIRED),
        key=version_order,
    )


def choose(
    table: RouteTable,
    name: str,
    version: str,
    *,
    tenant_id: str | None,
    idempotency_key: str | None = None,
) -> Decision:
    """The version for a request naming ``name`` (and ``version`` when pinned; ``""``
    otherwise). ``tenant_id`` None: no canary (job items run on the live version)."""
    if version:
        r = lookup(table, name, version)
        _must_serve(table, r)
        return Decision(version, "pinned")
    routes = known_routes(table, name)
    live, canary = routes.live(), routes.canary()
    if canary is not None and tenant_id is not None:
        who = sticky_key(routes, tenant_id, idempotency_key)
        if in_canary(routes, canary, who):
            if servable(table.served.get((name, canary.version))):
                return Decision(canary.version, "canary")
            if live is None:
                _must_serve(table, canary)  # raises: nothing else could take it
            else:
                _must_serve(table, live)
                return Decision(live.version, "live (canary not ready)")
    live = lookup(table, name, "")  # 404 when it has no live version
    _must_serve(table, live)
    return Decision(live.version, "live")


def _must_serve(table: RouteTable, r: VersionRecord) -> None:
    served = table.served.get((r.name, r.version))
    if not servable(served):
        raise unavailable(r.ref, served)
