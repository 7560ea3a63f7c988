"""Overload by tier: offer several times capacity, see who is served and who is shed.

    python -m bench.overload --factor 3 --seconds 30

Starts its own system with `sim` shrunk to batches of 10 (2 workers x 10 items per
100 ms = 200 items/s, so a load generator on this 2-core machine can offer 3x
capacity without becoming the bottleneck). Traffic: 70% free, 25% paid, 5%
enterprise, each tier one tenant with limits raised out of the way, so what sheds
is capacity-driven admission, not per-tenant rate limits. Prints a table per tier
(served, 429, 503, 504, percentiles, Retry-After present), checks that nothing
accepted was lost, samples the scheduler's and API's memory, and draws a chart.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import func, select

from bench.openloop import RunResult, run_open_loop
from bench.system import sim_system
from gristmill.devservices.stack import System
from results.db import make_engine
from results.schema import requests
from results.tenants import create_tenant, issue_key, set_plan

MIX = {"free": 0.70, "paid": 0.25, "enterprise": 0.05}
CAPACITY = 2 * 10 / 0.100


def tier_tenants(system: System) -> dict[str, tuple[str, str]]:
    out = {}
    with make_engine(system.settings.database_url).begin() as conn:
        for tier in MIX:
            name = f"overload-{tier}-{uuid.uuid4().hex[:6]}"
            t = create_tenant(conn, name, tier)
            set_plan(conn, name, rate_rps=1e6, burst=1e6)
            out[tier] = (t.id, issue_key(conn, t)[1])
    return out


def sample_memory(
    procs: list[psutil.Process], stop: threading.Event, out: list[tuple[float, float]]
) -> None:
    t0 = time.time()
    while not stop.wait(1.0):
        try:
            rss = sum(p.memory_info().rss for p in procs for p in [p, *p.children(True)])
        except psutil.Error:
            continue
        out.append((time.time() - t0, rss / 2**20))


async def offer(
    system: System, tenants: dict[str, tuple[str, str]], rate: float, seconds: float
) -> dict[str, RunResult]:
    tag = uuid.uuid4().hex[:6]

    async def one(tier: str) -> RunResult:
        r = rate * MIX[tier]
        return await run_open_loop(
            url=f"{system.url}/v1/infer",
            headers={"Authorization": f"Bearer {tenants[tier][1]}"},
            rate=r,
            count=int(r * seconds),
            timeout_s=60,
            make_body=lambda i: {"model": "sim", "input": f"{tag}-{tier}-{i}"},
        )

    results = await asyncio.gather(*(one(t) for t in MIX))
    return dict(zip(MIX, results, strict=True))


def table(results: dict[str, RunResult]) -> list[dict[str, Any]]:
    return [{"tier": tier, **r.outcomes()} for tier, r in results.items()]


def draw(
    rows: list[dict[str, Any]], mem: list[tuple[float, float]], path: Path, title: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
    tiers = [r["tier"] for r in rows]
    bottom = [0.0] * len(rows)
    for key, color in (
        ("served_200", "tab:green"),
        ("shed_503", "tab:orange"),
        ("shed_429", "tab:red"),
        ("late_504", "tab:gray"),
    ):
        vals = [r[key] / max(1, r["offered"]) for r in rows]
        a.bar(tiers, vals, bottom=bottom, label=key, color=color)
        bottom = [x + y for x, y in zip(bottom, vals, strict=True)]
    a.set(title="outcome share per tier", ylabel="fraction of offered")
    a.legend(fontsize=8)
    b.bar(tiers, [r["p95_ms"] for r in rows], color="tab:blue")
    b.set(title="p95 latency of served requests", ylabel="ms")
    b.grid(axis="y", alpha=0.3)
    c.plot([t for t, _ in mem], [m for _, m in mem])
    c.set(title="API + scheduler + workers memory", xlabel="s", ylabel="MiB RSS")
    c.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--factor", type=float, default=3.0, help="offered load / capacity")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rate = CAPACITY * args.factor
    with ExitStack() as stack:
        system = sim_system(stack, "gm-overload-", extra_env={"GRISTMILL_SIM_MAX_BATCH": "10"})
        tenants = tier_tenants(system)
        time.sleep(2)  # load reports reach the API
        procs = [psutil.Process(p.pid) for p in system.procs.values()]
        mem: list[tuple[float, float]] = []
        stop = threading.Event()
        threading.Thread(target=sample_memory, args=(procs, stop, mem), daemon=True).start()
        print(f"offering {rate:g} req/s ({args.factor:g}x capacity) for {args.seconds:g}s ...")
        results = asyncio.run(offer(system, tenants, rate, args.seconds))
        time.sleep(3)
        stop.set()
        # Accepted = answered 200 or 504 (504 is accepted, merely late): all must be persisted.
        with make_engine(system.settings.database_url).connect() as conn:
            persisted = {
                tier: conn.execute(
                    select(func.count())
                    .select_from(requests)
                    .where(requests.c.tenant_id == tenants[tier][0])
                ).scalar_one()
                for tier in MIX
            }
    rows = table(results)
    for row in rows:
        accepted = row["served_200"] + row["late_504"]
        row["persisted"] = persisted[row["tier"]]
        row["lost"] = max(0, accepted - persisted[row["tier"]])
    memory = {
        "start_mib": round(mem[0][1]) if mem else None,
        "end_mib": round(mem[-1][1]) if mem else None,
        "max_mib": round(max(m for _, m in mem)) if mem else None,
    }
    report = {
        "capacity_rps": CAPACITY,
        "offered_rps": rate,
        "seconds": args.seconds,
        "mix": MIX,
        "tiers": rows,
        "memory": memory,
    }
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"overload-{stamp}.json").write_text(json.dumps(report, indent=2))
    draw(
        rows,
        mem,
        args.out / f"overload-{stamp}.png",
        f"{args.factor:g}x capacity ({rate:g} req/s offered, capacity {CAPACITY:g}/s)",
    )
    print(
        f"\n{'tier':<11}{'offered':>8}{'200':>7}{'429':>6}{'503':>6}{'504':>6}"
        f"{'p50':>8}{'p95':>8}{'p99':>8}{'lost':>6}"
    )
    for r in rows:
        print(
            f"{r['tier']:<11}{r['offered']:>8}{r['served_200']:>7}{r['shed_429']:>6}"
            f"{r['shed_503']:>6}{r['late_504']:>6}{r['p50_ms']:>8}{r['p95_ms']:>8}"
            f"{r['p99_ms']:>8}{r['lost']:>6}"
        )
    print(f"memory (API + scheduler + workers): {memory}")
    med = statistics.median(m for _, m in mem) if mem else 0
    print(f"median RSS {med:.0f} MiB; report {args.out}/overload-{stamp}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
