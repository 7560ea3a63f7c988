"""Shedding by this API instance's own saturation, measured as event-loop lag.

Admission by predicted delay (ingest/admission.py) protects the workers: it sheds what
they could not serve in time. It cannot see the API process itself running out of CPU
(on a small machine, or with too few instances): then requests queue in the event
loop before any handler runs, every admitted one is late, and they time out as 504s
instead of being refused. The loop's lag (how late a timer fires) measures exactly
that queue. Above a tier's lower threshold a growing share of that tier's new
requests is refused with 503 + Retry-After, all of them above its upper threshold;
lower tiers start earlier, so they are shed first. Refusing is cheap (no body parse,
no Kafka, no wait), so shedding frees the CPU the admitted requests need.
"""

from __future__ import annotations

import asyncio
import random


def shed_share(lag_ms: float, lo_ms: float, hi_ms: float) -> float:
    """Share of new requests to refuse at ``lag_ms``: 0 below ``lo_ms``, 1 from
    ``hi_ms`` on, linear between (a ramp, so the lag settles instead of swinging)."""
    if lag_ms <= lo_ms:
        return 0.0
    if lag_ms >= hi_ms:
        return 1.0
    return (lag_ms - lo_ms) / (hi_ms - lo_ms)


class LoopLag:
    """How late this process's event loop runs a timer, smoothed (milliseconds)."""

    def __init__(self, period_s: float = 0.02, alpha: float = 0.3):
        self.period_s = period_s
        self.alpha = alpha
        self.lag_ms = 0.0

    def observe(self, late_s: float) -> None:
        self.lag_ms += self.alpha * (max(0.0, late_s) * 1000 - self.lag_ms)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t0 = loop.time()
            await asyncio.sleep(self.period_s)
            self.observe(loop.time() - t0 - self.period_s)

    def should_shed(
        self, tier: str, thresholds: dict[str, tuple[float, float]], draw: float | None = None
    ) -> bool:
        lo, hi = thresholds.get(tier) or min(thresholds.values())
        share = shed_share(self.lag_ms, lo, hi)
        return share > 0 and (random.random() if draw is None else draw) < share
