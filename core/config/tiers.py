"""Per-tier promises and limits."""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import (
    Field,
    model_validator,
)

from core.config._base import (
    AtLeastOne,
    PositiveFloat,
    PositiveMs,
    Share,
    _check_tier_order,
    _Concern,
)
from core.vocab import Tier


class TierSettings(_Concern):
    """Per-tier promises and limits (ingest/admission/policy.py, ingest/admission/capacity.py)."""

    # A request's deadline when the caller gives no timeout_ms: its tier's SLO.
    tier_slo_ms: dict[str, PositiveMs] = {"enterprise": 1_000, "paid": 2_000, "free": 5_000}
    # Rate limits per tenant (requests/s and burst; job items/s), unless its plan says.
    tier_rate_rps: dict[str, PositiveFloat] = {"free": 20.0, "paid": 200.0, "enterprise": 2000.0}
    tier_burst: dict[str, PositiveFloat] = {"free": 40.0, "paid": 400.0, "enterprise": 4000.0}
    tier_job_items_per_s: dict[str, PositiveFloat] = {
        "free": 5_000.0,
        "paid": 50_000.0,
        "enterprise": 500_000.0,
    }
    # Admission has no thresholds of its own: it derives them from each request's
    # deadline, the model's measured cost curve and the live workers (decision 24).
    # Event-loop lag (ms) at which an API instance starts refusing a tier's new sync
    # requests, and at which it refuses them all (ingest/admission/overload.py, decision 15): its
    # own CPU saturation, which the workers' load reports cannot show.
    loop_lag_shed_ms: dict[str, tuple[float, float]] = {
        "free": (50.0, 150.0),
        "paid": (75.0, 200.0),
        "enterprise": (100.0, 300.0),
    }
    # The same for the smoothed time from a sync result's commit to its answer (ms).
    answer_delay_shed_ms: dict[str, tuple[float, float]] = {
        "free": (50.0, 150.0),
        "paid": (75.0, 200.0),
        "enterprise": (100.0, 250.0),
    }
    # The share of max_inflight each tier may use.
    inflight_share: dict[str, Share] = {"free": 0.5, "paid": 0.8, "enterprise": 1.0}
    # Streamed answers one key may hold open on one API instance (all its processes): a
    # completion's stream, posted or resumed, a file's content, a job's results (a
    # follow=true stream counts against max_follow_streams_per_tenant instead).
    tier_max_streams: dict[str, AtLeastOne] = {"free": 8, "paid": 64, "enterprise": 256}
    # Behind the Gateway API Inference Extension each request names an InferenceObjective
    # (x-gateway-inference-objective): the tier each objective asks for. A tier's own
    # name always asks for that tier; a name not here asks for nothing. A hint only: a
    # request is never scheduled above its key's tier (decision 56).
    gateway_objective_tiers: dict[Annotated[str, Field(min_length=1, max_length=253)], Tier] = {}
    # service_tier "flex" (decision 66): a flex request's deadline when the caller gives
    # no timeout_ms (it waits in Kafka behind every sync tier, as job items do), and how
    # long its call is held open for the answer before a 202 with Location when the
    # caller sends no ``Prefer: wait`` (proxies commonly drop an idle call at 60 s).
    flex_timeout_ms: PositiveMs = 3_600_000
    flex_wait_ms: PositiveMs = 55_000

    @model_validator(mode="after")
    def _tier_orderings(self) -> Self:
        # A higher tier is promised no less: a shorter SLO, more rate, a later shed.
        _check_tier_order("tier_slo_ms", self.tier_slo_ms, rises=False)
        _check_tier_order("tier_rate_rps", self.tier_rate_rps, rises=True)
        _check_tier_order("tier_burst", self.tier_burst, rises=True)
        _check_tier_order("tier_job_items_per_s", self.tier_job_items_per_s, rises=True)
        _check_tier_order("inflight_share", self.inflight_share, rises=True)
        _check_tier_order("tier_max_streams", self.tier_max_streams, rises=True)
        if any(self.flex_timeout_ms < slo for slo in self.tier_slo_ms.values()):
            raise ValueError(
                f"flex_timeout_ms ({self.flex_timeout_ms}) must not be below any tier_slo_ms: "
                "flex is the slow tier"
            )
        for name in ("loop_lag_shed_ms", "answer_delay_shed_ms"):
            pairs: dict[str, tuple[float, float]] = getattr(self, name)
            for tier, (start, refuse_all) in pairs.items():
                if not 0 <= start <= refuse_all:
                    raise ValueError(
                        f"{name}[{tier}]: the start ({start}) must be at least 0 and at most "
                        f"the refuse-all value ({refuse_all})"
                    )
            _check_tier_order(f"{name} (start)", {t: p[0] for t, p in pairs.items()}, True)
            _check_tier_order(f"{name} (refuse all)", {t: p[1] for t, p in pairs.items()}, True)
        return self
