"""A computed batch's device time, charged to its items and their tenants. Pure.

Its measured compute is split over its items in proportion to what the length model
estimated for each (scheduler/core/itemcost.py, estimated before this batch teaches
it), so the shares add up to what the batch really took; then the length model learns
from the batch, and each tier's seconds are booked as received by its items' tenants
and owed to the tenants backlogged in the batch's queue (scheduler/core/shares.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from core.vocab import PRIORITY_CLASSES
from scheduler.core.batcher import Batch
from scheduler.core.itemcost import ItemCosts, split
from scheduler.core.shares import Shares, entitled


def charge(costs: ItemCosts, shares: Shares, batch: Batch, ms: float, now: float) -> None:
    """Set each item's ``device_ms`` and book the batch's seconds per tier and tenant."""
    ref = batch.key.ref
    items = batch.items
    parts = split(ms, [costs.item_ms(ref, p.padded) for p in items])
    for p, part in zip(items, parts, strict=True):
        p.device_ms = part
    costs.observe(ref, [p.padded for p in items], ms)
    for tier, (received, owed_to) in tiers(batch).items():
        shares.charge(now, tier, {t: v / 1000 for t, v in received.items()}, owed_to)


def tiers(batch: Batch) -> dict[str, tuple[dict[str, float], Mapping[str, float]]]:
    """Per tier of the batch's items: device ms received per tenant (``device_ms``), and
    the tenants (with weights) it was owed to: those backlogged when it was formed, or
    its own items' tenants for a batch formed without that record (a retry)."""
    out: dict[str, tuple[dict[str, float], Mapping[str, float]]] = {}
    own: dict[int, dict[str, float]] = {}
    received: dict[int, dict[str, float]] = {}
    for p in batch.items:
        got = received.setdefault(p.rank, {})
        got[p.tenant] = got.get(p.tenant, 0.0) + p.device_ms
        own.setdefault(p.rank, {})[p.tenant] = p.weight
    for rank, got in received.items():
        out[PRIORITY_CLASSES[rank]] = (got, batch.backlog.get(rank) or own[rank])
    return out


def batch_shares(batch: Batch) -> dict[str, dict[str, list[float]]]:
    """``{tier: {tenant: [received ms, entitled ms]}}`` of a charged batch: what its row
    in ``batches`` stores for the analysts' views (docs/analysts.md)."""
    out: dict[str, dict[str, list[float]]] = {}
    for tier, (got, owed_to) in tiers(batch).items():
        owed = entitled(sum(got.values()), owed_to)
        row = out[tier] = {}
        for tenant in got.keys() | owed.keys():
            row[tenant] = [round(got.get(tenant, 0.0), 3), round(owed.get(tenant, 0.0), 3)]
    return out
