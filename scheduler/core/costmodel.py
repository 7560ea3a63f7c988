"""A model's cost curve (compute time by batch size) and the batch size it implies.

The curve is learned from the batches the workers actually run: every measured batch
is a sample for its size, and a size's estimate is the median of its last
``SAMPLES_KEPT`` samples, so one slow batch (a garbage collection, a busy host) moves
nothing. The worker's warm-up profile seeds the curve but is provisional: a size's
warm-up reading is used only until that size has been measured online.

Sizes never measured are interpolated linearly between their neighbours; past the
largest known size the cost grows in proportion to the size (no batch is assumed to
come for free), and below the smallest it is flat.

The batch target is the size with the most items/s among those whose compute fits the
batch budget (``Settings.batch_budgets``: a sync request must be able to wait out one
running batch and run its own within its tier's SLO). The budget is the tightest tier's
that the model can meet at all (a batch of one fits it): a model too slow for the
enterprise SLO sizes its batches for paid's rather than running batches of one. A model
whose smallest batch exceeds every budget may use any size that costs no more than that
batch (a flat curve, like ``sim`` at 2 s, still runs full batches). Sizes above the target are
probed now and then when enough work is queued to fill them, so a curve that looked
bad once (a slow warm-up while the host was starting up) is measured again on real
batches rather than pinning the batch size for good. Pure: no clock, no I/O.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from core.config import Settings
from core.vocab import ModelRef

# Samples kept per batch size; the estimate is their median. Nine: a median of nine
# ignores up to four outliers, and at a batch every 100 ms it follows a real change
# (another process taking a core) within a second.
SAMPLES_KEPT = 9
# Sizes whose items/s is within this share of the best count as equally fast (timing
# noise is a few percent); among them the largest is taken (fewer batches per backlog).
NEAR_BEST = 0.95
# A size is probed again after this many batches of the model at other sizes: often
# enough to follow a curve that changed (the host got quieter), rarely enough that a
# probe that turns out slow costs a negligible share of the batches.
REPROBE_EVERY = 200
# Measured batches before a probed size's estimate is trusted over a provisional one.
CONFIRMED = 3
# The pace of saturated workers is measured over the last SATURATED_WINDOW_S of takes,
# and trusted once it spans SATURATED_MIN_S: several batch times of any model up to
# 2 s per batch, and short enough to follow a worker that slowed down.
SATURATED_WINDOW_S = 10.0
SATURATED_MIN_S = 3.0
# What the default settings imply (per tier: (SLO - 50 ms linger - 20 ms margin) / 2, so
# 465, 965 and 2,465 ms), for a cost model built without the deployment's settings; a
# scheduler passes its own (Settings.batch_budgets).
DEFAULT_BUDGETS_MS = Settings.model_construct().batch_budgets()
DEFAULT_BUDGET_MS = DEFAULT_BUDGETS_MS[0]


@dataclass
class _Size:
    samples: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLES_KEPT))
    warmup_ms: float | None = None  # provisional: until this size is measured online

    def estimate(self) -> float | None:
        if self.samples:
            return statistics.median(self.samples)
        return self.warmup_ms


@dataclass
class _Curve:
    sizes: dict[int, _Size] = field(default_factory=dict)
    batches: int = 0  # batches measured online
    probed_at: dict[int, int] = field(default_factory=dict)  # size -> ``batches`` then
    probing: set[int] = field(default_factory=set)  # sizes of probes not measured yet
    cache: dict[int, float] | None = None  # size -> estimate, rebuilt after a change
    # Batches taken while another full batch still waited (time, items): the workers
    # were saturated, so their pace is the throughput the model really gets, gaps
    # between batches included. ``run_workers``: the live workers it was measured with.
    run: deque[tuple[float, int]] = field(default_factory=deque)
    run_workers: int = 0


class CostModel:
    def __init__(
        self,
        *,
        default_ms: float = 50.0,
        budget_ms: float | Sequence[float] = DEFAULT_BUDGETS_MS,
    ):
        self.default_ms = default_ms
        # Longest compute per batch, one per tier SLO, tightest first.
        self.budgets_ms = tuple(
            sorted([budget_ms] if isinstance(budget_ms, float | int) else budget_ms)
        )
        self._curves: dict[ModelRef, _Curve] = {}
        self._targets: dict[tuple[ModelRef, int], int] = {}

    # ---- learning ------------------------------------------------------------------
    def seed(self, model: ModelRef, profile: dict[int, float]) -> None:
        """A worker's warm-up readings (provisional until measured online)."""
        curve = self._curves.setdefault(model, _Curve())
        for size, ms in profile.items():
            s = curve.sizes.setdefault(int(size), _Size())
            if ms > 0:
                # Several workers warm up at once and contend for the host: the fastest
                # reading of a size is the least disturbed one.
                s.warmup_ms = ms if s.warmup_ms is None else min(s.warmup_ms, ms)
        self._changed(model, curve)

    def observe(self, model: ModelRef, size: int, ms: float) -> None:
        """A batch the worker ran: ``size`` items in ``ms`` of compute."""
        if size < 1 or ms <= 0:
            return
        curve = self._curves.setdefault(model, _Curve())
        s = curve.sizes.setdefault(size, _Size())
        if size in curve.probing:
            curve.probing.discard(size)
            est = s.estimate() if s.samples else None
            if est is not None and ms < NEAR_BEST * est:
                # A probe found this size faster than its kept samples say: they are from
                # a slower time (a busy host, workers starting together) that probes, one
                # every REPROBE_EVERY batches, would take minutes to outvote. Start again
                # from this reading; if the size now wins, its own batches re-measure it
                # at once, so an optimistic reading is corrected within a few batches.
                s.samples.clear()
        s.samples.append(ms)
        curve.batches += 1
        self._changed(model, curve)

    def _changed(self, model: ModelRef, curve: _Curve) -> None:
        curve.cache = None
        for k in [k for k in self._targets if k[0] == model]:
            del self._targets[k]

    # ---- predicting ----------------------------------------------------------------
    def known(self, model: ModelRef) -> dict[int, float]:
        """Current estimate per size that has one (median of measured, else warm-up)."""
        curve = self._curves.get(model)
        if curve is None:
            return {}
        if curve.cache is None:
            table: dict[int, float] = {}
            # A batch never costs more than a larger one that was measured: a warm-up
            # reading above that is a disturbed one (the process's first calls, a busy
            # host) and is capped, since the size itself may never run to correct it.
            cap = math.inf
            for n, size in sorted(curve.sizes.items(), reverse=True):
                est = size.estimate()
                if est is None:
                    continue
                if size.samples:
                    cap = min(cap, est)
                else:
                    est = min(est, cap)
                table[n] = est
            curve.cache = dict(sorted(table.items()))
        return curve.cache

    def measured(self, model: ModelRef, size: int) -> int:
        """Batches of this size measured online (and still kept)."""
        curve = self._curves.get(model)
        s = curve.sizes.get(size) if curve else None
        return len(s.samples) if s else 0

    def predict_ms(self, model: ModelRef, size: int) -> float:
        table = self.known(model)
        if not table:
            return self.default_ms
        got = table.get(size)
        if got is not None:
            return got
        sizes = list(table)
        i = bisect.bisect_left(sizes, size)
        if i == 0:
            return table[sizes[0]]
        if i == len(sizes):
            top = sizes[-1]
            return table[top] * size / top  # no larger batch comes for free
        lo, hi = sizes[i - 1], sizes[i]
        return table[lo] + (size - lo) / (hi - lo) * (table[hi] - table[lo])

    # ---- the batch size ------------------------------------------------------------
    def batch_target(self, model: ModelRef, cap: int) -> int:
        """The size batches of this model should have (at most ``cap``, the largest the
        worker takes): the most items/s within the batch budget."""
        key = (model, cap)
        got = self._targets.get(key)
        if got is None:
            got = self._targets[key] = self._pick(model, cap)
        return got

    def _fits_ms(self, model: ModelRef) -> float:
        """Longest compute a batch may take: the tightest budget a batch of one fits,
        or what a batch of one costs (within the noise band) when it fits none."""
        single = self.predict_ms(model, 1)
        fitting = [b for b in self.budgets_ms if single <= b]
        return fitting[0] if fitting else single / NEAR_BEST

    def _pick(self, model: ModelRef, cap: int) -> int:
        table = self.known(model)
        if not table:
            return cap
        limit = self._fits_ms(model)
        # Candidates: the known sizes, the cap where the curve reaches it, and between
        # two known sizes the largest the interpolated curve fits in the limit. Beyond
        # the largest known size nothing is taken on trust (probes measure it first).
        known = sorted(table)
        sizes = {n for n in known if n <= cap} | ({cap} if cap < known[-1] else set())
        for lo, hi in itertools.pairwise(known):
            a, b = table[lo], table[hi]
            if a <= limit < b:
                sizes.add(min(cap, lo + int((limit - a) / (b - a) * (hi - lo))))
        rate = {}
        for n in sorted(sizes):
            ms = self.predict_ms(model, n)
            if ms <= limit:
                rate[n] = n / max(ms, 1e-9)
        if not rate:
            return 1
        best = max(rate.values())
        return max(n for n, r in rate.items() if r >= NEAR_BEST * best)

    def batch_size(self, model: ModelRef, cap: int, queued: int) -> int:
        """How many of ``queued`` waiting items the next batch takes: the target, or a
        larger size being probed when at least that many wait (and the target's own
        per-item cost says the probe would fit the budget)."""
        target = self.batch_target(model, cap)
        if queued <= target:
            return target
        probe = self._probe(model, cap, target, queued)
        return probe if probe else target

    def _probe(self, model: ModelRef, cap: int, target: int, queued: int) -> int:
        curve = self._curves.get(model)
        if curve is None:
            return 0
        size = min(cap, 2 * target)
        if size <= target or queued < size:
            return 0
        # Optimistic: at the target's per-item cost (the size's own reading may be the
        # slow sample that is to be rechecked).
        if self.predict_ms(model, target) * size / target > self._fits_ms(model):
            return 0
        last = curve.probed_at.get(size)
        trusted = self.measured(model, size) >= CONFIRMED
        if trusted and last is not None and curve.batches - last < REPROBE_EVERY:
            return 0
        if not trusted and last is not None and curve.batches == last:
            return 0  # one probe at a time: wait for its measurement
        curve.probed_at[size] = curve.batches
        curve.probing.add(size)
        return size

    def took(self, model: ModelRef, size: int, now: float, left: int) -> None:
        """A batch of ``size`` was taken at ``now``, ``left`` items of the model still
        waiting. While a full batch is left every free worker starts at once: the pace
        of such takes is what the workers deliver (dispatch and result handling
        included), which compute times alone overstate."""
        curve = self._curves.setdefault(model, _Curve())
        if left < size:
            curve.run.clear()  # a worker may now wait for work: the pace says nothing
            return
        curve.run.append((now, size))
        while curve.run and curve.run[0][0] < now - SATURATED_WINDOW_S:
            curve.run.popleft()

    def saturated_rate(self, model: ModelRef, workers: int) -> float | None:
        """Items/s the workers delivered over the last saturated stretch (at least
        ``SATURATED_MIN_S`` long, with the same number of live workers), else None."""
        curve = self._curves.get(model)
        if curve is None:
            return None
        if curve.run_workers != workers:
            curve.run_workers = workers
            curve.run.clear()
            return None
        if len(curve.run) < 2:
            return None
        span = curve.run[-1][0] - curve.run[0][0]
        if span < SATURATED_MIN_S:
            return None
        return sum(n for _, n in itertools.islice(curve.run, 1, None)) / span

    def throughput(self, model: ModelRef, cap: int) -> float:
        """Items/s of one worker at the batch target."""
        n = self.batch_target(model, cap)
        return n / (self.predict_ms(model, n) / 1000)
