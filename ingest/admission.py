"""Capacity-driven admission: shed load by predicted queue delay, lowest tier first.

Every scheduler reports, each second, what its live workers can do (items/s per
model at the best measured batch size) and what is waiting (queued requests per
model and class, Kafka lag per class). The predicted delay for a new request of
class c is the work queued at c or above, divided by the capacity that the
target utilization leaves usable. A class is shed (503 + Retry-After) when its
predicted delay exceeds its threshold; thresholds rise with the tier, so free
traffic is shed first, then paid, enterprise last. When workers join or die the
capacity, and so the shedding point, follows within a report interval. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gristmill.topics import PRIORITY_CLASSES


@dataclass
class LoadReport:
    capacity: dict[str, float] = field(default_factory=dict)  # model ref -> items/s
    backlog: dict[str, dict[str, int]] = field(default_factory=dict)  # ref -> class -> n
    lag: dict[str, int] = field(default_factory=dict)  # class -> messages not yet consumed


@dataclass
class LoadView:
    capacity: dict[str, float]
    backlog: dict[str, dict[str, int]]
    lag: dict[str, int]

    @classmethod
    def combine(cls, reports: Iterable[LoadReport]) -> LoadView:
        cap: dict[str, float] = {}
        back: dict[str, dict[str, int]] = {}
        lag: dict[str, int] = {}
        for r in reports:
            for ref, c in r.capacity.items():
                cap[ref] = cap.get(ref, 0.0) + c
            for ref, by_class in r.backlog.items():
                dst = back.setdefault(ref, {})
                for cls_, n in by_class.items():
                    dst[cls_] = dst.get(cls_, 0) + n
            for cls_, n in r.lag.items():
                lag[cls_] = lag.get(cls_, 0) + n
        return cls(cap, back, lag)


@dataclass(frozen=True)
class Decision:
    admit: bool
    predicted_delay_s: float
    retry_after_s: float = 0.0
    reason: str = ""


def predicted_delay_s(view: LoadView, ref: str, priority: str, utilization: float) -> float:
    """Seconds of work queued ahead of a new request of this class for this model."""
    cap = view.capacity.get(ref, 0.0) * utilization
    rank = PRIORITY_CLASSES.index(priority)
    ahead_classes = PRIORITY_CLASSES[: rank + 1]
    queued = sum(view.backlog.get(ref, {}).get(c, 0) for c in ahead_classes)
    # Kafka lag is not split by model; count it against every model (conservative).
    queued += sum(view.lag.get(c, 0) for c in ahead_classes)
    if cap <= 0:
        return math.inf if queued else 0.0
    return queued / cap


def decide(
    view: LoadView | None,
    ref: str,
    priority: str,
    *,
    utilization: float,
    thresholds_ms: Mapping[str, float],
) -> Decision:
    if view is None or ref not in view.capacity:
        return Decision(True, 0.0)  # no reports yet: admit (the catalog already 503s dead models)
    delay = predicted_delay_s(view, ref, priority, utilization)
    limit = thresholds_ms.get(priority, math.inf) / 1000
    if delay <= limit:
        return Decision(True, delay)
    drain = delay if math.isfinite(delay) else 5.0
    return Decision(
        False,
        delay,
        retry_after_s=max(1.0, drain),
        reason=f"overloaded: about {delay:.1f}s of {priority}-or-higher work queued",
    )
