"""The cost curves and batch limits of each worker class (heterogeneous pools). Pure.

One cost curve per worker class, keyed by model inside, each learned from every batch
its class runs; it picks the batch size within the batch budget of each tier's SLO
(scheduler/core/costmodel.py). Limits: the largest batch each model's workers take (the
smallest worker's own limit), overall and per class. The dispatch core (dispatch.py)
sizes and times a worker's batches by its class's ``Sizing``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from core.protocol import ModelInfo
from core.vocab import ModelRef
from scheduler.core.batcher import Sizing
from scheduler.core.costmodel import CostModel
from scheduler.core.plans import DEFAULT_CLASS


class ClassCurves:
    def __init__(self, batch_budget_ms: float | Sequence[float]):
        self._budget_ms = batch_budget_ms
        self.cost = self._new_curve()  # the default class's
        self.curves: dict[str, CostModel] = {DEFAULT_CLASS: self.cost}
        self.max_batch: dict[ModelRef, int] = {}
        self.class_max_batch: dict[tuple[ModelRef, str], int] = {}
        # Built once per class, passed with every call to the batcher (never swapped in).
        self._sizings: dict[str, Sizing] = {}

    def _new_curve(self) -> CostModel:
        return CostModel(budget_ms=self._budget_ms)

    def curve(self, worker_class: str) -> CostModel:
        """The cost curves of one worker class."""
        c = self.curves.get(worker_class)
        if c is None:
            c = self.curves[worker_class] = self._new_curve()
        return c

    def cap(self, worker_class: str, ref: ModelRef) -> int:
        """The largest batch of ``ref`` a worker of ``worker_class`` takes."""
        return self.class_max_batch.get((ref, worker_class), self.max_batch.get(ref, 1))

    def sizing(self, worker_class: str) -> Sizing:
        """How batches for a worker of ``worker_class`` are sized and timed."""
        s = self._sizings.get(worker_class)
        if s is None:
            s = Sizing(self.curve(worker_class), partial(self.cap, worker_class))
            self._sizings[worker_class] = s
        return s

    def learn(self, models: Sequence[ModelInfo], worker_class: str) -> None:
        """A worker's models: their limits, and their warm-up profiles as seeds."""
        curve = self.curve(worker_class)
        for m in models:
            ref = ModelRef(m.name, m.version)
            profile = {int(k): v for k, v in m.profile_ms.items()}
            # The worker's own limit (memory bounded it at warm-up); the batch size
            # within it follows the measured curve, which the warm-up only seeds.
            cap = m.max_batch_size
            self.max_batch[ref] = min(self.max_batch.get(ref, cap), cap)
            key = (ref, worker_class)
            self.class_max_batch[key] = min(self.class_max_batch.get(key, cap), cap)
            curve.seed(ref, profile)
