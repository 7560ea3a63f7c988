"""What a scheduler's live workers can do, from measured batch costs. Pure.

Admission (ingest/admission/capacity.py) needs more than items/s: how long a batch takes at the
size batches get (a request waits out one and runs in one), what a batch of one costs
(the least latency any request can have) and how many workers share the queue (how
often one comes free). So each model's entry is a small record.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from core.load_report import ModelCapacity
from core.vocab import ModelRef
from scheduler.core.costmodel import CostModel


def capacity_by_model(
    cost: CostModel, worker_refs: Iterable[set[ModelRef]], max_batch: dict[ModelRef, int]
) -> dict[str, ModelCapacity]:
    """Summed over live workers, keyed "name@version". A worker serving several models
    is counted for each (the report is an upper bound per model)."""
    workers: dict[ModelRef, int] = {}
    for refs in worker_refs:
        for ref in refs:
            workers[ref] = workers.get(ref, 0) + 1
    out: dict[str, ModelCapacity] = {}
    for ref, n in workers.items():
        cap = max_batch.get(ref, 1)
        size = cost.batch_target(ref, cap)
        batch_ms = cost.predict_ms(ref, size)
        compute = n * size / (batch_ms / 1000)
        # What saturated workers delivered, gaps between batches included, when known:
        # lower tiers get what higher ones leave of it, so a few percent matter.
        delivered = cost.saturated_rate(ref, n)
        out[ModelRef(*ref).label()] = ModelCapacity(
            items_s=min(compute, delivered) if delivered else compute,
            batch=size,
            batch_ms=batch_ms,
            single_ms=cost.predict_ms(ref, 1),
            workers=n,
        )
    return out


def merge_capacity(by_class: Sequence[dict[str, ModelCapacity]]) -> dict[str, ModelCapacity]:
    """One record per model from its records per worker class: the rates and workers add
    up; the batch shape is the class that delivers most's, and a batch of one is the
    fastest class's (what admission may promise the tightest deadline)."""
    out: dict[str, ModelCapacity] = {}
    for records in by_class:
        for key, rec in records.items():
            have = out.get(key)
            if have is None:
                out[key] = ModelCapacity(**rec)
                continue
            lead = rec if rec["items_s"] > have["items_s"] else have
            out[key] = ModelCapacity(
                items_s=have["items_s"] + rec["items_s"],
                batch=lead["batch"],
                batch_ms=lead["batch_ms"],
                single_ms=min(have["single_ms"], rec["single_ms"]),
                workers=have["workers"] + rec["workers"],
            )
    return out
