"""What a scheduler's live workers can do, from measured batch costs. Pure."""

from __future__ import annotations

from collections.abc import Iterable

from core.vocab import ModelRef
from scheduler.costmodel import CostModel


def best_throughput(cost: CostModel, ref: ModelRef, max_batch: int) -> float:
    """Items/s of one worker at its best measured batch size (a full batch if unmeasured)."""
    known = {b: ms for b, ms in cost.known(ref).items() if b <= max_batch and ms > 0}
    if not known:
        return max_batch / (cost.predict_ms(ref, max_batch) / 1000)
    return max(b / (ms / 1000) for b, ms in known.items())


def capacity_by_model(
    cost: CostModel, worker_refs: Iterable[set[ModelRef]], max_batch: dict[ModelRef, int]
) -> dict[str, float]:
    """Sum over live workers, keyed "name@version". A worker serving several models is
    counted for each (the report is an upper bound per model)."""
    out: dict[str, float] = {}
    for refs in worker_refs:
        for ref in refs:
            key = f"{ref[0]}@{ref[1]}"
            out[key] = out.get(key, 0.0) + best_throughput(cost, ref, max_batch.get(ref, 1))
    return out
