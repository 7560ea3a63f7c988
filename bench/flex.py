"""The flex service tier at three times capacity (decision 66): what it fills, what it
costs sync traffic, and that it loses nothing.

    python -m bench.flex --shape 100:10 --factor 3 --sync-share 0.5 --seconds 20 --runs 3

Starts its own system (2 ``sim`` workers of ``--shape``, batch ms : batch limit), then
per run, open loop (bench/openloop.py):

1. baseline: sync traffic alone, ``--sync-share`` of capacity (70% free, 25% paid, 5%
   enterprise, one tenant each with its rate limit raised out of the way);
2. the same sync traffic, with flex requests beside it bringing the offer to
   ``--factor`` times capacity (one free tenant, ``service_tier: "flex"``, ``Prefer:
   respond-async``: accepted is a 202 once Kafka has it);
3. until every accepted flex request has its row.

It reports per phase each sync tier's outcomes and latency percentiles, the workers'
busy share (from the ``batches`` table, the phase's first seconds left out), and for
flex what was offered, accepted, refused, stored (succeeded / expired / failed) and lost
(accepted without a row), with its completion times from the request log. Medians over
runs; JSON and a chart go to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.openloop import RunResult, run_open_loop
from bench.overload import MIX, WORKERS, capacity, tier_tenants, worker_use
from bench.system import sim_system
from gristmill.devservices.stack import System
from results.db import make_engine
from results.tenants import create_tenant, issue_key, set_plan

WARMUP_S = 3.0  # left out of the busy share: the first batches fill up


def flex_tenant(system: System) -> tuple[str, str]:
    with make_engine(system.settings.database_url).begin() as conn:
        name = f"flex-{uuid.uuid4().hex[:6]}"
        t = create_tenant(conn, name, "free")
        set_plan(conn, name, rate_rps=1e6, burst=1e6)
        return t.id, issue_key(conn, t)[1]


async def offer(
    system: System,
    tenants: dict[str, tuple[str, str]],
    sync_rate: float,
    flex_rate: float,
    seconds: float,
) -> tuple[dict[str, RunResult], RunResult | None]:
    tag = uuid.uuid4().hex[:6]

    def loop(key: str, rate: float, body: Any, extra: dict[str, str]) -> Any:
        return run_open_loop(
            url=f"{system.url}/v1/infer",
            headers={"Authorization": f"Bearer {key}", **extra},
            rate=rate,
            count=int(rate * seconds),
            timeout_s=60,
            make_body=body,
        )

    sync = [
        loop(
            tenants[t][1],
            sync_rate * MIX[t],
            lambda i, t=t: {"model": "sim", "input": f"{tag}-{t}-{i}"},
            {},
        )
        for t in MIX
    ]
    flex = []
    if flex_rate > 0:
        flex_body = lambda i: {"model": "sim", "input": f"{tag}-flex-{i}", "service_tier": "flex"}  # noqa: E731
        flex = [loop(tenants["flex"][1], flex_rate, flex_body, {"Prefer": "respond-async"})]
    results = await asyncio.gather(*sync, *flex)
    return dict(zip(MIX, results[: len(MIX)], strict=True)), (results[-1] if flex else None)


def flex_rows(system: System, tenant_id: str, t0: float) -> dict[str, Any]:
    """The flex tenant's rows received since ``t0``: by status, and the time from
    arrival to stored (s) of those that succeeded."""
    with make_engine(system.settings.database_url).connect() as conn:
        by_status: dict[str, int] = dict(
            conn.execute(
                text(
                    "SELECT status, count(*) FROM requests WHERE tenant_id = :t "
                    "AND received_at >= to_timestamp(:t0) GROUP BY status"
                ),
                {"t": tenant_id, "t0": t0},
            ).all()
        )
        pct = conn.execute(
            text(
                "SELECT percentile_cont(ARRAY[0.5, 0.95, 1.0]) WITHIN GROUP (ORDER BY "
                "extract(epoch FROM persisted_at - received_at)), "
                "count(*) FILTER (WHERE service_tier = 'flex' AND priority = 'jobs') "
                "FROM requests WHERE tenant_id = :t AND received_at >= to_timestamp(:t0) "
                "AND status = 'succeeded'"
            ),
            {"t": tenant_id, "t0": t0},
        ).one()
    done_s = [round(float(x), 2) for x in (pct[0] or [])]
    return {
        "by_status": {str(k): int(v) for k, v in by_status.items()},
        "done_s_p50_p95_max": done_s,
        "logged_as_flex": int(pct[1]),
    }


def sync_rows(results: dict[str, RunResult]) -> dict[str, dict[str, Any]]:
    return {t: r.outcomes() for t, r in results.items()}


def one_run(
    system: System,
    tenants: dict[str, tuple[str, str]],
    cap: float,
    sync_rate: float,
    flex_rate: float,
    seconds: float,
) -> dict[str, Any]:
    t0 = time.time()
    base, _ = asyncio.run(offer(system, tenants, sync_rate, 0, seconds))
    t1 = time.time()
    time.sleep(2)
    t2 = time.time()
    mixed, flex = asyncio.run(offer(system, tenants, sync_rate, flex_rate, seconds))
    t3 = time.time()
    assert flex is not None
    accepted = sum(1 for s in flex.samples if s.status in (200, 202))
    # Every accepted flex request gets a row: wait for them (the backlog drains at
    # capacity once the sync traffic stops).
    until = time.time() + max(120.0, 4 * accepted / cap)
    rows = flex_rows(system, tenants["flex"][0], t2)
    while sum(rows["by_status"].values()) < accepted and time.time() < until:
        time.sleep(1.0)
        rows = flex_rows(system, tenants["flex"][0], t2)
    stored = sum(rows["by_status"].values())
    return {
        "baseline": {
            "sync": sync_rows(base),
            "workers": worker_use(system, t0 + WARMUP_S, t1, cap),
        },
        "with_flex": {
            "sync": sync_rows(mixed),
            "workers": worker_use(system, t2 + WARMUP_S, t3, cap),
            "flex": {
                "offered": len(flex.samples),
                "accepted": accepted,
                "statuses": flex.statuses(),
                "accept_ms_p50_p95": [
                    round(flex.percentile(50, only_ok=False), 1),
                    round(flex.percentile(95, only_ok=False), 1),
                ],
                "stored": stored,
                "lost": max(0, accepted - stored),
                **rows,
            },
        },
    }


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def med(path: list[str]) -> float:
        vals = []
        for r in runs:
            x: Any = r
            for p in path:
                x = x[p]
            vals.append(float(x))
        return round(statistics.median(vals), 4)

    out: dict[str, Any] = {}
    for phase in ("baseline", "with_flex"):
        out[phase] = {
            "busy": med([phase, "workers", "busy"]),
            "capacity_used": med([phase, "workers", "capacity_used"]),
            "sync": {
                t: {
                    k: med([phase, "sync", t, k])
                    for k in ("p50_ms", "p95_ms", "p99_ms", "served_200", "shed_503", "late_504")
                }
                for t in MIX
            },
        }
    out["flex"] = {
        k: med(["with_flex", "flex", k]) for k in ("offered", "accepted", "stored", "lost")
    }
    out["flex"]["lost_total"] = sum(r["with_flex"]["flex"]["lost"] for r in runs)
    return out


def draw(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = report["median"]
    tiers = list(MIX)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    x = range(len(tiers))
    base = [m["baseline"]["sync"][t]["p95_ms"] for t in tiers]
    mixed = [m["with_flex"]["sync"][t]["p95_ms"] for t in tiers]
    a.bar([i - 0.2 for i in x], base, 0.4, label="sync alone")
    a.bar([i + 0.2 for i in x], mixed, 0.4, label="sync + flex (3x capacity)")
    a.set_xticks(list(x), tiers)
    a.set(title="sync p95 latency (median of runs)", ylabel="ms")
    a.legend(fontsize=8)
    phases = ["sync alone", "sync + flex"]
    busy = [m["baseline"]["busy"], m["with_flex"]["busy"]]
    b.bar(phases, busy, color=["tab:gray", "tab:green"])
    b.axhline(0.95, color="red", linestyle="--", label="95%")
    b.set(title="workers' busy share", ylim=(0, 1.05))
    b.legend(fontsize=8)
    f = m["flex"]
    shape = report["shape"]
    fig.suptitle(
        f"sim {shape['batch_ms']:g} ms / {shape['max_batch']}, {WORKERS} workers, "
        f"capacity {report['capacity_rps']:g}/s: flex accepted {f['accepted']:g}, "
        f"stored {f['stored']:g}, lost {f['lost_total']} ({report['runs']} runs)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_report(rep: dict[str, Any]) -> None:
    m = rep["median"]
    print(
        f"\ncapacity {rep['capacity_rps']:g}/s; sync {rep['sync_rps']:g}/s, "
        f"flex {rep['flex_rps']:g}/s; medians of {rep['runs']} runs"
    )
    print(f"{'phase':<11}{'tier':<11}{'200':>7}{'503':>6}{'504':>6}{'p50':>8}{'p95':>8}{'p99':>8}")
    for phase in ("baseline", "with_flex"):
        for t in MIX:
            r = m[phase]["sync"][t]
            print(
                f"{phase:<11}{t:<11}{r['served_200']:>7g}{r['shed_503']:>6g}{r['late_504']:>6g}"
                f"{r['p50_ms']:>8g}{r['p95_ms']:>8g}{r['p99_ms']:>8g}"
            )
        print(
            f"{phase:<11}workers busy {m[phase]['busy']:.1%}, "
            f"capacity used {m[phase]['capacity_used']:.1%}"
        )
    print(f"flex: {m['flex']} (lost over all runs: {m['flex']['lost_total']})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shape", default="100:10", help="batch_ms:max_batch of sim")
    ap.add_argument("--factor", type=float, default=3.0, help="offered load / capacity")
    ap.add_argument("--sync-share", type=float, default=0.5, help="sync load / capacity")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    ms, _, mb = args.shape.partition(":")
    batch_ms, max_batch = float(ms), int(mb)
    cap = capacity(batch_ms, max_batch)
    sync_rate = cap * args.sync_share
    flex_rate = cap * (args.factor - args.sync_share)
    env = {"GRISTMILL_SIM_BATCH_MS": str(batch_ms), "GRISTMILL_SIM_MAX_BATCH": str(max_batch)}
    with ExitStack() as stack:
        system = sim_system(stack, "gm-flex-", workers=WORKERS, extra_env=env)
        tenants = tier_tenants(system)
        tenants["flex"] = flex_tenant(system)
        time.sleep(3)  # load reports reach the API
        runs = []
        for i in range(args.runs):
            print(f"run {i + 1}/{args.runs}: sync {sync_rate:g}/s, then + flex {flex_rate:g}/s")
            runs.append(one_run(system, tenants, cap, sync_rate, flex_rate, args.seconds))
    report = {
        "shape": {"batch_ms": batch_ms, "max_batch": max_batch, "workers": WORKERS},
        "capacity_rps": cap,
        "sync_rps": sync_rate,
        "flex_rps": flex_rate,
        "factor": args.factor,
        "seconds": args.seconds,
        "runs": args.runs,
        "median": medians(runs),
        "each_run": runs,
    }
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"flex-{stamp}.json").write_text(json.dumps(report, indent=2))
    draw(report, args.out / f"flex-{stamp}.png")
    print_report(report)
    print(f"\nreport in {args.out}/flex-{stamp}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
