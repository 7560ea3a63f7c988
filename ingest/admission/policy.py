"""Applying the tier policy to a request: rate limits (429) and admission (503).

The decisions themselves are pure (ratelimit.py, admission.py); this module
only picks the tenant's numbers and turns a refusal into the right error and
headers (RateLimit-* as in the IETF RateLimit header fields draft).
"""

from __future__ import annotations

import math
import time

from core.config import Settings
from core.errors import InvalidInput, RateLimited, Unavailable
from core.vocab import TIER_TO_CLASS
from ingest import metrics
from ingest.admission.capacity import least_latency_s, timeout_floor_ms
from ingest.admission.kv import decide_kv
from ingest.admission.load_watch import LoadWatch
from ingest.admission.overload import Overload
from ingest.admission.ratelimit import InflightLimiter, TenantLimiter, Verdict
from ingest.admission.view import LoadView
from ingest.edge.db_health import too_slow_to_store
from results.tenants import Tenant

# What a tenant's rate buys: its requests, and apart from them its reads of the job API
# (a tenant may poll as fast as it may submit, and polling never eats into its
# inference rate: decision 26).
REQUESTS = "requests"
READS = "reads"


def ratelimit_headers(v: Verdict) -> dict[str, str]:
    return {
        "RateLimit-Limit": str(math.floor(v.limit)),
        "RateLimit-Remaining": str(v.remaining),
        "RateLimit-Reset": str(math.ceil(v.reset_s)),
    }


def check_rate(
    limiter: TenantLimiter,
    settings: Settings,
    tenant: Tenant,
    items: int = 1,
    *,
    bucket: str = REQUESTS,
) -> dict[str, str]:
    """One request against the tenant's requests/s (``bucket``: its requests or its
    reads); returns headers for the answer.

    A request of many inputs (an embeddings array, a KServe batch) costs one token per
    input, as that many single requests would; it is taken while the bucket holds any
    tokens and may leave it in debt, so one larger than the burst is not refused
    forever (the next request waits the debt off)."""
    v = limiter.check(
        tenant.id,
        bucket,
        rate=tenant.rate_rps or settings.tier_rate_rps[tenant.tier],
        burst=tenant.burst or settings.tier_burst[tenant.tier],
        n=items,
        now=time.monotonic(),
        allow_debt=items > 1,
    )
    what = "read rate" if bucket == READS else "rate limit"
    return enforce(v, f"{what} of {v.limit:g} requests/s exceeded for this key")


def enforce(v: Verdict, refusal: str) -> dict[str, str]:
    """A bucket's verdict as the answer's RateLimit-* headers, or a 429 saying
    ``refusal`` with them and Retry-After."""
    headers = ratelimit_headers(v)
    if not v.allowed:
        raise RateLimited(refusal, retry_after_s=v.retry_after_s, headers=headers)
    return headers


def take_instance_slot(
    overload: Overload, inflight: InflightLimiter, settings: Settings, tier: str
) -> None:
    """Refuse (503) when this API instance is saturated, else hold one of its in-flight
    slots: the caller releases it (``inflight.release()``) when it answers."""
    metrics.request_tier.set(tier)
    if overload.should_shed(tier, settings.loop_lag_shed_ms, settings.answer_delay_shed_ms):
        raise Unavailable(
            f"overloaded: this API instance's event loop is {overload.lag.lag_ms:.0f} ms "
            f"behind and its answers leave {overload.answer.ms():.0f} ms after their "
            "result is stored; retry shortly",
            retry_after_s=1,
            reason="instance_overload",
        )
    if not inflight.try_acquire(tier):
        raise Unavailable(
            "this API instance is at capacity; retry shortly",
            retry_after_s=1,
            reason="instance_capacity",
        )


def check_timeout_floor(
    view: LoadView | None,
    settings: Settings,
    model_ref: str,
    asked_ms: int,
    field: str = "timeout_ms",
) -> None:
    """400 for a caller's timeout shorter than this model could ever meet: no load makes
    it possible, so it is the caller's mistake, not a 503 to retry (decision 62).
    ``field``: where the door's caller set it (KServe: parameters.timeout, in us)."""
    capacity = view.capacity.get(model_ref) if view is not None else None
    floor = timeout_floor_ms(capacity, settings.deadline_margin_ms / 1000)
    if asked_ms < floor:
        single = f"{capacity.single_ms:.0f} ms for a batch of one and " if capacity else ""
        where = "" if field == "timeout_ms" else f" ({field})"
        raise InvalidInput(
            f"timeout_ms{where} of {asked_ms} ms is below the minimum of {floor} ms this "
            f"model can ever meet ({single}{settings.deadline_margin_ms} ms to store and "
            f"send the answer); send timeout_ms >= {floor}",
            field=field,
        )


def check_admission(
    load: LoadWatch,
    settings: Settings,
    tenant: Tenant,
    model_ref: str,
    timeout_ms: int | None = None,
) -> None:
    """Admit the request or raise 503 with the reason (ingest/admission/capacity.py, decision 24).
    ``timeout_ms``: the caller's own deadline; without one, the tier's SLO."""
    cls_ = TIER_TO_CLASS[tenant.tier]
    timeout = timeout_ms or settings.tier_slo_ms.get(tenant.tier, settings.default_timeout_ms)
    now = time.monotonic()
    # Storing the result is part of every request's time: a commit of this instance
    # stalled for longer than a deadline leaves refuses what it alone makes late; it
    # comes off the deadline of the rest (ingest/edge/db_health.py, decision 39).
    commit_s = load.health.stall_s(now) if load.health is not None else 0.0
    if commit_s > 0:
        capacity = load.view.capacity.get(model_ref) if load.view is not None else None
        margin_s = settings.deadline_margin_ms / 1000
        least_s = least_latency_s(capacity, margin_s) if capacity is not None else margin_s
        why = too_slow_to_store(timeout / 1000, commit_s, least_s)
        if why is not None:
            raise Unavailable(why, retry_after_s=max(1.0, commit_s), reason="slow_database")
    d = load.admission.decide(
        load.view,
        model_ref,
        cls_,
        tenant=tenant.id,
        weight=tenant.weight,
        deadline_s=timeout / 1000 - commit_s,
        now=now,
        instances=load.limiter.instances,
    )
    if not d.admit:
        # Metrics label: a deadline no batch can meet, or the queue ahead too long.
        label = "unmeetable_deadline" if d.reason == "deadline" else "predicted_delay"
        raise Unavailable(d.message, retry_after_s=d.retry_after_s or None, reason=label)


def check_kv(
    load: LoadWatch,
    tenant: Tenant,
    model_ref: str,
    prompt_tokens: int,
    max_tokens: int,
    deadline: float,
    *,
    waits: bool = True,
) -> None:
    """A completion against the generation model's published KV cache
    (ingest/admission/kv.py): 400 when it can never fit, 503 when its wait for blocks
    passes its first-token ``deadline`` (epoch s) - unless it may wait (``waits``
    False: flex, never refused for capacity, decision 66)."""
    view = load.view
    states = [] if view is None else view.kv.get(model_ref, [])
    d = decide_kv(
        states,
        TIER_TO_CLASS[tenant.tier],
        prompt_tokens,
        max_tokens,
        now=time.time(),
        deadline=deadline,
    )
    if d.never_fits:
        raise InvalidInput(d.message, field="max_tokens")
    if not d.admit and waits:
        error = Unavailable(d.message, retry_after_s=d.retry_after_s, reason="kv_capacity")
        metrics.refused(tenant.tier, error)
        raise error
