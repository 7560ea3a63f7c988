"""How many API, scheduler and worker processes one host runs. Pure.

A GPU host runs one worker per GPU (it owns the device), several scheduler processes
per GPU (one Python process cannot feed a fast GPU: decision 14) and enough API
processes for the share of traffic the host takes. The numbers come from what each
process costs per request, measured on a GPU host (``bench/gpuhost``,
docs/bench/gpu-host.md), and from the host's cores and GPUs:

1. Workers: one per GPU; with no GPU, ``cpu_workers`` (the model runs on the CPU).
2. Cores for the request path: the host's cores less each worker's cores and, where
   Kafka and PostgreSQL share the host, the cores they take per request.
3. The sync rate those cores carry: cores / (API + scheduler CPU per request) at the
   target utilization (a process kept busier than that queues: latency grows past it).
4. API processes for that rate, at least one, each kept at most ``api_busy`` of a core:
   a uvicorn process is one event loop, and its answers queue behind its own work well
   before the core is full (measured: ``HostCosts``).
5. Schedulers: per GPU enough to feed its batches (``feeders_per_gpu``), and enough
   for the sync rate's CPU within the cores the API leaves.

Everything is in ``HostCosts`` so a measurement file can replace the defaults.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class HostCosts:
    """CPU milliseconds per sync request by process kind, and what one process feeds.

    Defaults: the whole system on one H200 host, 16 cores, at 10,000-12,500 sync req/s
    (docs/bench/gpu-host.md r14: API 0.54-0.67 ms, schedulers 0.13-0.18, Kafka
    0.11-0.19, PostgreSQL 0.07-0.20 a request, by run)."""

    api_ms: float = 0.6
    # The share of a core one API process may be kept busy. r14: 11 processes at 0.62 of
    # a core each answered all of 12,500 req/s; 8 at 0.73 held 10,000 req/s once warm
    # but turned away up to a tenth of it on a fresh start, and more past it.
    api_busy: float = 0.6
    scheduler_ms: float = 0.15
    kafka_ms: float = 0.15  # counted only where the brokers share the host
    postgres_ms: float = 0.15  # likewise the database
    worker_cores: float = 1.0  # a GPU worker's own CPU: packing, launching, results
    # Schedulers that keep one GPU's batches coming back to back: 6 fed an H200 at
    # 33,000-35,000 job items/s in three runs, 3 at 24,000-28,000 in four
    # (docs/bench/gpu-host.md, r7 and r8).
    feeders_per_gpu: int = 6

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostCosts:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown cost fields: {', '.join(sorted(unknown))}")
        costs = cls(**data)
        for name, value in asdict(costs).items():
            if value < 0 or (name in ("api_ms", "scheduler_ms", "api_busy") and value <= 0):
                raise ValueError(f"{name} must be positive, got {value}")
        if costs.api_busy > 1:
            raise ValueError(f"api_busy is a share of one core, at most 1, got {costs.api_busy}")
        return costs


@dataclass(frozen=True)
class HostShape:
    api_processes: int
    schedulers: int
    workers: int
    gpus: int
    sync_capacity_rps: float  # what the chosen API and scheduler processes carry
    reasons: list[str] = field(default_factory=list)


def shape_host(
    cores: int,
    gpus: int,
    costs: HostCosts | None = None,
    *,
    colocated: bool = False,
    reserve_cores: float = 0.0,
    utilization: float = 0.8,
    cpu_workers: int = 2,
    api_processes: int | None = None,
    schedulers: int | None = None,
    workers_per_gpu: int = 1,
) -> HostShape:
    """The processes for a host of ``cores`` and ``gpus``; explicit counts are kept.

    ``colocated``: Kafka and PostgreSQL run on this host too (a single-host deployment,
    the benchmark). ``reserve_cores``: cores kept for something else (a load generator).
    ``workers_per_gpu``: worker processes sharing each GPU (one by default: it owns the
    device; more split one process's launch path, an experiment of issue 28).
    """
    if cores < 1:
        raise ValueError("cores must be at least 1")
    if gpus < 0:
        raise ValueError("gpus must be 0 or more")
    if not 0 < utilization <= 1:
        raise ValueError("utilization must be in (0, 1]")
    if workers_per_gpu < 1:
        raise ValueError("workers_per_gpu must be at least 1")
    c = costs or HostCosts()
    reasons: list[str] = []
    workers = gpus * workers_per_gpu if gpus else cpu_workers
    worker_cores = workers * c.worker_cores if gpus else 0.0
    per_gpu = "one" if workers_per_gpu == 1 else str(workers_per_gpu)
    reasons.append(
        f"{workers} worker(s): {per_gpu} per GPU" if gpus else f"{workers} CPU worker(s), no GPU"
    )
    per_request_ms = c.api_ms + c.scheduler_ms
    shared_ms = c.kafka_ms + c.postgres_ms if colocated else 0.0
    free = max(1.0, cores - worker_cores - reserve_cores)
    # The request path's cores, with Kafka and PostgreSQL's share of each request taken out.
    path_cores = free * per_request_ms / (per_request_ms + shared_ms)
    rate = path_cores * utilization * 1000 / per_request_ms
    reasons.append(
        f"{free:g} cores for the request path"
        + (f" ({free - path_cores:.1f} of them for Kafka and PostgreSQL)" if colocated else "")
        + f": {rate:,.0f} sync req/s at {utilization:.0%} busy"
    )
    if api_processes is None:
        api_processes = max(1, math.ceil(rate * c.api_ms / 1000 / c.api_busy))
        reasons.append(
            f"{api_processes} API process(es) at {c.api_ms} ms of CPU a request, "
            f"each at most {c.api_busy:.0%} busy"
        )
    else:
        reasons.append(f"{api_processes} API process(es), as asked")
    if schedulers is None:
        for_rate = math.ceil(rate * c.scheduler_ms / 1000 / utilization)
        for_gpus = gpus * c.feeders_per_gpu
        # What the API's busy cores leave of the path's cores (an API process is busy
        # ``utilization`` of its time at the rate, not a whole core).
        room = max(1, int(path_cores - rate * c.api_ms / 1000))
        # Feeding a GPU comes first (a job keeps each feeder busy while the API idles);
        # the sync rate's need is capped by the cores the API leaves.
        schedulers = max(1, for_gpus, min(for_rate, room))
        reasons.append(
            f"{schedulers} scheduler(s): {for_gpus} to feed {gpus} GPU(s), "
            f"{for_rate} for the sync rate (at most {room} by the cores the API leaves)"
        )
    else:
        reasons.append(f"{schedulers} scheduler(s), as asked")
    capacity = min(
        api_processes * c.api_busy * 1000 / c.api_ms,
        schedulers * utilization * 1000 / c.scheduler_ms,
    )
    return HostShape(api_processes, schedulers, workers, gpus, round(capacity), reasons)


def partitions_for(schedulers: int, minimum: int = 3) -> int:
    """Partitions per topic so every scheduler holds the same number of each topic's
    partitions (a multiple of the scheduler count), at least ``minimum``."""
    if schedulers < 1:
        raise ValueError("schedulers must be at least 1")
    return schedulers * max(1, math.ceil(minimum / schedulers))
