"""Predicted compute time per (model, version, batch size), learned online.

Seeded by the worker's warmup profile, then updated from every measured batch
with an exponentially weighted mean per batch size. Sizes never measured are
interpolated linearly between their neighbours (flat beyond the ends), which
fits both the flat launch-bound region of a GPU and the linear region after it.
"""

from __future__ import annotations

import bisect

from core.vocab import ModelRef


class CostModel:
    def __init__(self, *, default_ms: float = 50.0, alpha: float = 0.2):
        self.default_ms = default_ms
        self.alpha = alpha
        self._ms: dict[ModelRef, dict[int, float]] = {}

    def seed(self, model: ModelRef, profile: dict[int, float]) -> None:
        """Warmup measurements; existing online estimates for a size win."""
        table = self._ms.setdefault(model, {})
        for size, ms in profile.items():
            table.setdefault(int(size), float(ms))

    def observe(self, model: ModelRef, size: int, ms: float) -> None:
        table = self._ms.setdefault(model, {})
        prev = table.get(size)
        table[size] = ms if prev is None else prev + self.alpha * (ms - prev)

    def predict_ms(self, model: ModelRef, size: int) -> float:
        table = self._ms.get(model)
        if not table:
            return self.default_ms
        if size in table:
            return table[size]
        sizes = sorted(table)
        i = bisect.bisect_left(sizes, size)
        if i == 0:
            return table[sizes[0]]
        if i == len(sizes):
            return table[sizes[-1]]
        lo, hi = sizes[i - 1], sizes[i]
        frac = (size - lo) / (hi - lo)
        return table[lo] + frac * (table[hi] - table[lo])

    def known(self, model: ModelRef) -> dict[int, float]:
        return dict(self._ms.get(model, {}))


NEAR_BEST = 0.95


def best_batch_size(profile: dict[int, float], max_batch: int, budget_ms: float) -> int:
    """The batch size with the most items per second among those whose measured (or
    interpolated) compute time fits ``budget_ms``, at most ``max_batch``.

    The largest batch is usually the fastest per item, but not always (a CPU model's
    curve can bend the other way), and a batch that takes longer than the budget makes
    every sync request in it, and the one waiting behind it, miss its SLO. A model
    slower than the budget even for its smallest batch still runs that batch.
    """
    if not profile:
        return max_batch
    curve = CostModel()
    curve.seed(ModelRef("m", ""), profile)  # its interpolation, for a max between measured sizes
    sizes = sorted({n for n in profile if n <= max_batch} | {max_batch})
    ms = {n: curve.predict_ms(ModelRef("m", ""), n) for n in sizes}
    rate = {n: n / max(t, 1e-9) for n, t in ms.items() if t <= budget_ms}
    if not rate:
        return sizes[0]
    # Warmup timings are noisy: among sizes within 5% of the best rate take the largest
    # (it drains a backlog in fewer batches), not a small one that won by noise.
    best = max(rate.values())
    return max(n for n, r in rate.items() if r >= NEAR_BEST * best)
