"""Predicted compute time per (model, version, batch size), learned online.

Seeded by the worker's warmup profile, then updated from every measured batch
with an exponentially weighted mean per batch size. Sizes never measured are
interpolated linearly between their neighbours (flat beyond the ends), which
fits both the flat launch-bound region of a GPU and the linear region after it.
"""

from __future__ import annotations

import bisect

ModelRef = tuple[str, str]  # (model, version)


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
