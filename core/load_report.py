"""What a scheduler reports about its load, each second, for admission.

Written by the scheduler (scheduler/core/load_report.py builds the tenant part), stored
by results/load.py (one ``scheduler_load`` row per scheduler), read back and summed
by every API instance (ingest/admission/capacity.py). Keys are ``name@version`` model refs
and priority class names, as JSON keeps them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypedDict

# In a tenant backlog, the entry that sums the tenants too small to name.
REST = "*"

# ref -> class -> tenant -> [queued, weight]; the tenant ``REST`` stands for the rest:
# [queued by all smaller tenants together, how many such tenants].
TenantBacklog = dict[str, dict[str, dict[str, list[float]]]]


class ModelCapacity(TypedDict):
    """What the live workers of one model can do (scheduler/core/capacity.py)."""

    # all live workers together, at the batch size batches get: from compute times, or
    # what they delivered while saturated when that is less
    items_s: float
    batch: int  # that batch size
    batch_ms: float  # its predicted compute time
    single_ms: float  # compute time of a batch of one
    workers: int  # live workers serving the model


class KVState(TypedDict):
    """A generation model's KV cache as its scheduler's policy sees it
    (scheduler/core/generation/kv_report.py), for the API's KV admission."""

    num_blocks: int  # the worker's pool
    block_size: int  # tokens a block holds
    used: int  # blocks held by running sequences
    wanted: dict[str, int]  # class -> blocks its waiting sequences' prompt + max_tokens need
    decode_tok_s: float  # tokens sampled per second of stepping, over a recent window


@dataclass
class LoadReport:
    # model ref -> its record (a bare items/s from a scheduler of an older version)
    capacity: Mapping[str, ModelCapacity | float] = field(default_factory=dict)
    backlog: dict[str, dict[str, int]] = field(default_factory=dict)  # ref -> class -> n
    lag: dict[str, int] = field(default_factory=dict)  # class -> held back in Kafka (paused)
    tenants: TenantBacklog = field(default_factory=dict)
    kv: dict[str, KVState] = field(default_factory=dict)  # generation model ref -> its cache
