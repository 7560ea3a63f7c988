"""What a scheduler tells the API instances about who owns its queues. Pure.

Admission (ingest/admission/capacity.py) predicts a request's delay from the work queued
ahead of it; inside a class that depends on the request's tenant, because the
class's tenants are served by weighted round robin. So the report names, per
model and class, the tenants with the largest queues; the many small ones are
summed into one entry (``*``: requests, number of tenants) to keep it small.
"""

from __future__ import annotations

from core.load_report import REST, TenantBacklog
from core.vocab import PRIORITY_CLASSES, ModelRef

TOP_TENANTS = 20


def tenant_backlog(
    depths: dict[ModelRef, list[dict[str, tuple[int, float]]]], top: int = TOP_TENANTS
) -> TenantBacklog:
    """``{"model@version": {class: {tenant: [queued, weight], "*": [queued, tenants]}}}``."""
    out: TenantBacklog = {}
    for (name, version), by_rank in depths.items():
        for rank, by_tenant in enumerate(by_rank):
            if not by_tenant:
                continue
            ranked = sorted(by_tenant.items(), key=lambda kv: -kv[1][0])
            entry: dict[str, list[float]] = {t: [n, w] for t, (n, w) in ranked[:top]}
            rest = ranked[top:]
            if rest:
                entry[REST] = [sum(n for _, (n, _) in rest), len(rest)]
            out.setdefault(f"{name}@{version}", {})[PRIORITY_CLASSES[rank]] = entry
    return out
