"""What one item of a batch costs in device time, by its length. Pure.

A batch's measured compute is modelled as ``a * items + b * tokens`` (per model): ``a``
what every item costs whatever its length (its row's pooling, normalizing, copying),
``b`` what a token costs. Tokens are counted by length bucket (rounded up to
``LENGTH_BUCKET``, as the worker pads a sorted sub-batch), so an item's estimate is
``a + b * bucket``. The two are fitted by least squares over the model's last
``WINDOW`` batches, so the estimate follows what batches really took.

When the batches seen do not tell the two apart (every batch had about the same mix
of lengths, so items and tokens rose together; or the mixes varied too little for the
timing noise, by the fit's own standard errors) the fit is not trusted and the whole
cost is put on tokens: the forward is linear in padded tokens from small batches on
(docs/bench/gpu.md), so that is the closer of the two guesses. Before any batch is
measured the same proportion holds (one millisecond a token, a scale that cancels in
``relative``).

``relative`` is what the fair queue charges (scheduler/core/fairness.py): an item's
estimate over the estimate of an item of the window's mean length, so a model whose
inputs all have one length charges 1 an item, as counting requests did.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

# Padded length step: the embedding worker pads a sorted sub-batch to a multiple of 8
# (workers/models/embedding/runtime.py SEQ_ALIGN), so a 10-token input computes 16.
LENGTH_BUCKET = 8
# Batches kept per model: at a batch every 100 ms, the last 6 s; enough batches of
# varied mixes for two parameters, recent enough to follow a host that got busier.
WINDOW = 128
# How far from collinear (1 - the uncentered correlation of items and tokens, squared)
# the batches must be before the per-item term is fitted: below this the mixes were
# too alike and timing noise would decide ``a``.
MIN_SPREAD = 0.002
# The largest standard error, relative to the value, at which the two fitted terms are
# trusted (the fit's residuals say how well the batches pinned them down): past it the
# mixes varied too little for the timing noise there was.
MAX_REL_ERROR = 0.5


def bucket(tokens: int) -> int:
    """The padded length an input of ``tokens`` computes (at least one bucket)."""
    return max(LENGTH_BUCKET, -(-tokens // LENGTH_BUCKET) * LENGTH_BUCKET)


@dataclass
class _Fit:
    batches: deque[tuple[int, int, float]] = field(default_factory=lambda: deque(maxlen=WINDOW))
    per_item: float = 0.0  # a, ms
    per_token: float = 1.0  # b, ms (1 before any batch: only the proportion matters)
    mean_bucket: float = float(LENGTH_BUCKET)  # mean padded length of the window's items


class ItemCosts:
    """Per model (any hashable key), an item's device time by its length."""

    def __init__(self) -> None:
        self._fits: dict[Hashable, _Fit] = {}

    def observe(self, model: Hashable, buckets: Sequence[int], ms: float) -> None:
        """A batch ran: its items' padded lengths (``bucket``) and its measured compute."""
        if not buckets or ms <= 0:
            return
        fit = self._fits.setdefault(model, _Fit())
        fit.batches.append((len(buckets), sum(buckets), ms))
        self._refit(fit)

    @staticmethod
    def _refit(fit: _Fit) -> None:
        snn = snt = stt = snm = stm = 0.0
        items = tokens = 0
        for n, t, ms in fit.batches:
            snn += n * n
            snt += n * t
            stt += t * t
            snm += n * ms
            stm += t * ms
            items += n
            tokens += t
        fit.mean_bucket = tokens / items
        det = snn * stt - snt * snt
        a = b = -1.0
        if det > MIN_SPREAD * snn * stt and len(fit.batches) > 2:
            a = (snm * stt - stm * snt) / det
            b = (stm * snn - snm * snt) / det
            sq = sum((ms - a * n - b * t) ** 2 for n, t, ms in fit.batches)
            var = sq / (len(fit.batches) - 2) / det  # times stt for a, snn for b
            if (var * stt) ** 0.5 > MAX_REL_ERROR * a or (var * snn) ** 0.5 > MAX_REL_ERROR * b:
                a = -1.0
        if a < 0 or b <= 0:  # too alike to tell apart, or a fit no cost can have
            a, b = 0.0, stm / stt
        fit.per_item, fit.per_token = a, b

    def item_ms(self, model: Hashable, padded: int) -> float:
        """Estimated device ms of one item of padded length ``padded`` in a batch."""
        fit = self._fits.get(model)
        if fit is None:
            return float(padded)
        return fit.per_item + fit.per_token * padded

    def relative(self, model: Hashable, padded: int) -> float:
        """An item's estimate over that of an item of the recent mean length."""
        fit = self._fits.get(model)
        if fit is None:
            return padded / LENGTH_BUCKET
        unit = fit.per_item + fit.per_token * fit.mean_bucket
        return (fit.per_item + fit.per_token * padded) / unit if unit > 0 else 1.0

    def terms(self, model: Hashable) -> tuple[float, float] | None:
        """The fitted (per item, per token) ms, or None before any batch."""
        fit = self._fits.get(model)
        return None if fit is None else (fit.per_item, fit.per_token)


def split(measured_ms: float, estimates: Sequence[float]) -> list[float]:
    """A batch's measured time shared over its items in proportion to their estimates."""
    total = math.fsum(estimates)
    if total <= 0:
        return [measured_ms / len(estimates)] * len(estimates) if estimates else []
    return [measured_ms * e / total for e in estimates]
