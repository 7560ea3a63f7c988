"""``gristmill simulate``: one scenario on the simulator, a table per tier.

    gristmill simulate --batch-ms 500 --max-batch 256 --workers 4 --load 3
    gristmill simulate --curve 1:14,4:27,16:105,64:430 --max-batch 256 --rate 120
    gristmill simulate --batch-ms 20 --max-batch 16 --workers 1000 --rate 100000 --seconds 10
    gristmill simulate --burst paid:noisy:50000@5 --lose-worker 20:0 --json out.json

Traffic is Poisson per tenant; ``--mix`` splits it over tiers and ``--tenants`` over
that many tenants per tier. ``--load`` gives the rate as a multiple of the fleet's
capacity (at the batch size the batch budget allows) instead of ``--rate``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from gristmill.simulate.engine import simulate as run_scenario
from gristmill.simulate.scenario import CostCurve, Scenario, Stream, WorkerEvent


def parse_curve(text: str, cap: int) -> CostCurve:
    """``"1:14,16:105"``: batch size -> ms."""
    points = sorted((int(a), float(b)) for a, b in (p.split(":") for p in text.split(",")))
    return CostCurve(tuple(points), cap)


def parse_mix(text: str) -> dict[str, float]:
    mix = {k: float(v) for k, v in (p.split("=") for p in text.split(","))}
    total = sum(mix.values())
    return {k: v / total for k, v in mix.items()}


def parse_burst(text: str) -> Stream:
    """``tier:tenant:count@start_s[:rate]`` (rate default: 10x the count per second)."""
    head, _, tail = text.partition("@")
    tier, tenant, count = head.split(":")
    start, _, rate = tail.partition(":")
    n = int(count)
    return Stream(tier, tenant, float(rate) if rate else n * 10.0, float(start), count=n)


def simulate(
    batch_ms: float = typer.Option(100.0, help="compute time of any batch (a flat curve)"),
    max_batch: int = typer.Option(100, help="the largest batch a worker takes"),
    curve: str = typer.Option("", help="a measured curve instead: size:ms,size:ms,..."),
    jitter: float = typer.Option(0.0, help="spread of each batch's time (lognormal sigma)"),
    workers: int = typer.Option(2, min=1),
    schedulers: int = typer.Option(1, min=1),
    api_instances: int = typer.Option(1, min=1),
    rate: float = typer.Option(0.0, help="offered requests/s in all"),
    load: float = typer.Option(3.0, help="offered load as a multiple of capacity (no --rate)"),
    mix: str = typer.Option("enterprise=0.05,paid=0.25,free=0.7"),
    tenants: int = typer.Option(1, min=1, help="tenants per tier, sharing its traffic"),
    seconds: float = typer.Option(30.0, min=1.0),
    burst: list[str] = typer.Option([], help="tier:tenant:count@start_s[:rate]"),
    lose_worker: list[str] = typer.Option([], help="at_s:worker_index"),
    partitions: int = typer.Option(
        0, help="partitions per class topic (0: as many as schedulers, at least 6)"
    ),
    key_by_tenant: bool = typer.Option(False, help="key Kafka messages by tenant"),
    seed: int = 1,
    json_out: Path | None = typer.Option(None, "--json", help="write the full result here"),
) -> None:
    """Simulate the request path on a virtual clock and print what each tier got."""
    cost = parse_curve(curve, max_batch) if curve else CostCurve.flat(batch_ms, max_batch)
    cost = CostCurve(cost.points, cost.cap, jitter)
    probe = Scenario(cost=cost, streams=[], workers=workers)
    total = rate or load * probe.usable_capacity()
    streams = [
        Stream(tier, f"{tier}-{i}", total * share / tenants)
        for tier, share in parse_mix(mix).items()
        for i in range(tenants)
    ]
    streams += [parse_burst(b) for b in burst]
    events = []
    for ev in lose_worker:
        at, _, idx = ev.partition(":")
        events.append(WorkerEvent(float(at), int(idx)))
    sc = Scenario(
        cost=cost,
        streams=streams,
        workers=workers,
        schedulers=schedulers,
        api_instances=api_instances,
        seconds=seconds,
        partitions=partitions or max(6, schedulers),
        key_by_tenant=key_by_tenant,
        worker_events=events,
        seed=seed,
    )
    t0 = time.perf_counter()
    result = run_scenario(sc)
    wall = time.perf_counter() - t0
    typer.echo(
        f"{seconds:g} s simulated in {wall:.1f} s: {workers} workers, capacity "
        f"{sc.usable_capacity():,.0f} items/s, offered {total:,.0f} req/s"
    )
    typer.echo(result.table())
    if json_out is not None:
        json_out.write_text(json.dumps(result.summary(), indent=2, default=str))


def main() -> None:
    typer.run(simulate)
