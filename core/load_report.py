"""What a scheduler reports about its load, each second, for admission.

Written by the scheduler (scheduler/load_report.py builds the tenant part), stored
by results/load.py (one ``scheduler_load`` row per scheduler), read back and summed
by every API instance (ingest/admission.py). Keys are ``name@version`` model refs
and priority class names, as JSON keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# In a tenant backlog, the entry that sums the tenants too small to name.
REST = "*"

# ref -> class -> tenant -> [queued, weight]; the tenant ``REST`` stands for the rest:
# [queued by all smaller tenants together, how many such tenants].
TenantBacklog = dict[str, dict[str, dict[str, list[float]]]]


@dataclass
class LoadReport:
    capacity: dict[str, float] = field(default_factory=dict)  # model ref -> items/s
    backlog: dict[str, dict[str, int]] = field(default_factory=dict)  # ref -> class -> n
    lag: dict[str, int] = field(default_factory=dict)  # class -> held back in Kafka (paused)
    tenants: TenantBacklog = field(default_factory=dict)
