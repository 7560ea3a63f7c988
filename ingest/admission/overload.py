"""Shedding by saturation the schedulers' load reports cannot see: this API
instance's event-loop lag, and how long its answers take once a result is stored.

Admission by predicted delay (ingest/admission/capacity.py) protects the workers: it sheds what
they could not serve in time. It cannot see the API process itself running out of CPU
(on a small machine, or with too few instances): then requests queue in the event
loop before any handler runs, every admitted one is late, and they time out as 504s
instead of being refused. The loop's lag (how late a timer fires) measures exactly
that queue. Above a tier's lower threshold a growing share of that tier's new
requests is refused with 503 + Retry-After, all of them above its upper threshold;
lower tiers start earlier, so they are shed first. Refusing is cheap (no body parse,
no Kafka, no wait), so shedding frees the CPU the admitted requests need.

The loop's lag stays moderate when the CPU runs short in the other processes of
the machine or in the API's own I/O callbacks: on the 2-core box at 1,300 req/s the
lag's median was 18 ms while the answers took 700 ms at p95. So the answer delay
counts too: for each answered sync request, the time from its result reaching this
instance (the announcement heard, or the row fetched) to its answer leaving (the
wake-up, the answer), smoothed, and decaying while nothing is answered (so a burst's
high reading cannot keep shedding once the traffic is gone). That stretch is all API
work: it grows when the API instance is short of CPU, and stays short when requests
are slow for other reasons (a backlog after a Kafka outage, the workers' queue, a slow
commit), which other rules handle. A first version counted the whole time outside
batch wait and compute, and kept shedding for seconds after a Kafka broker came back
while the backlog drained; a second counted from the transaction's start
(``persisted_at``), so a commit slowed by a PostgreSQL checkpoint read as this
instance's saturation and shed every tier while the database caught up (issue 30,
decision 39).
"""

from __future__ import annotations

import asyncio
import math
import random
import time

from core.vocab import PRIORITY_CLASSES, TIER_TO_CLASS

# Per tier: (where shedding starts, where it refuses everything), in ms of a signal.
Ramps = dict[str, tuple[float, float]]


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


class AnswerDelay:
    """Answered sync requests' time from their result's arrival here to the answer, smoothed
    (ms). Each reading is capped at ``cap_ms``, so a few stragglers (a listener that
    reconnected, a result found by the slow poll) cannot hold the guard shut."""

    def __init__(self, alpha: float = 0.02, tau_s: float = 0.5, cap_ms: float = 1000.0):
        self.alpha = alpha
        self.tau_s = tau_s
        self.cap_ms = cap_ms
        self._ms = 0.0
        self._at = 0.0  # monotonic time of the last observation

    def ms(self, now: float | None = None) -> float:
        if not self._at:
            return 0.0
        idle = (time.monotonic() if now is None else now) - self._at
        return self._ms * math.exp(-max(0.0, idle) / self.tau_s)

    def observe(self, ms: float, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        cur = self.ms(now)
        self._ms = cur + self.alpha * (min(max(0.0, ms), self.cap_ms) - cur)
        self._at = now


def _share(value: float, tier: str, thresholds: dict[str, tuple[float, float]]) -> float:
    lo, hi = thresholds.get(tier) or min(thresholds.values())
    return shed_share(value, lo, hi)


class Overload:
    """Both signals; a tier's share to refuse (``share``) is the larger of the two, and
    all of it while any higher tier is being refused (strict order between tiers,
    decision 24: the ramps overlap, and a lower tier must not get in while a higher one
    is turned away)."""

    def __init__(self) -> None:
        self.lag = LoopLag()
        self.answer = AnswerDelay()

    def _own_share(self, tier: str, lag_ms: Ramps, answer_ms: Ramps) -> float:
        return max(_share(self.lag.lag_ms, tier, lag_ms), _share(self.answer.ms(), tier, answer_ms))

    def share(self, tier: str, lag_ms: Ramps, answer_ms: Ramps) -> float:
        """The share of ``tier``'s requests to refuse; ``lag_ms``, ``answer_ms``: each
        tier's ramp of either signal (settings.loop_lag_shed_ms, answer_delay_shed_ms)."""
        cls_ = TIER_TO_CLASS.get(tier)
        if cls_ is not None:
            for higher in PRIORITY_CLASSES[: cls_.rank]:
                if self._own_share(higher, lag_ms, answer_ms) > 0:
                    return 1.0
        return self._own_share(tier, lag_ms, answer_ms)

    def should_shed(
        self, tier: str, lag_ms: Ramps, answer_ms: Ramps, draw: float | None = None
    ) -> bool:
        share = self.share(tier, lag_ms, answer_ms)
        return share > 0 and (random.random() if draw is None else draw) < share
