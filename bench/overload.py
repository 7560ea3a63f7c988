"""Overload by tier at several model shapes, measured and simulated side by side.

    python -m bench.overload --shapes 20:2,100:10,500:50 --factor 3 --seconds 40

For each shape (batch time in ms : batch limit of ``sim``, set through
GRISTMILL_SIM_BATCH_MS / GRISTMILL_SIM_MAX_BATCH) it starts its own system (2 workers),
offers ``--factor`` times the workers' capacity open loop for ``--seconds``: 70% free,
25% paid, 5% enterprise, each tier one tenant with its rate limit raised out of the
way, so what refuses is capacity-driven admission. It reports per tier what was
served, refused (with Retry-After or not) and late, latency percentiles against the
tier's SLO, how busy the workers were (from the ``batches`` table), and checks that
every accepted request (200 or 504) has its row. Then it runs the simulator
(gristmill/simulate/) on the same shape and traffic, with the path's overheads
measured in this run, and prints both side by side. JSON and PNG per shape and one
summary chart go to ``--out``.
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

from sqlalchemy import func, select, text

from bench.openloop import RunResult, run_open_loop
from bench.stages import stage_percentiles
from bench.system import sim_system
from gristmill.devservices.stack import System
from gristmill.simulate.engine import simulate
from gristmill.simulate.scenario import CostCurve, Overheads, Scenario, Stream
from results.db import make_engine
from results.schema import requests
from results.tenants import create_tenant, issue_key, set_plan

MIX = {"free": 0.70, "paid": 0.25, "enterprise": 0.05}
SLO_MS = {"enterprise": 1000.0, "paid": 2000.0, "free": 5000.0}
WORKERS = 2


def capacity(batch_ms: float, max_batch: int, workers: int = WORKERS) -> float:
    return workers * max_batch / (batch_ms / 1000)


def tier_tenants(system: System) -> dict[str, tuple[str, str]]:
    out = {}
    with make_engine(system.settings.database_url).begin() as conn:
        for tier in MIX:
            name = f"overload-{tier}-{uuid.uuid4().hex[:6]}"
            t = create_tenant(conn, name, tier)
            set_plan(conn, name, rate_rps=1e6, burst=1e6)
            out[tier] = (t.id, issue_key(conn, t)[1])
    return out


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


def worker_use(system: System, t0: float, t1: float, cap: float) -> dict[str, float]:
    """Busy share (compute time over workers x window) and items computed over what the
    workers could do, for batches that started in [t0, t1] (epoch s)."""
    with make_engine(system.settings.database_url).connect() as conn:
        row = conn.execute(
            text(
                "SELECT coalesce(sum(compute_ms), 0), coalesce(sum(size), 0), count(*) "
                "FROM batches WHERE compute_start_at BETWEEN to_timestamp(:a) AND to_timestamp(:b)"
            ),
            {"a": t0, "b": t1},
        ).one()
    span = t1 - t0
    return {
        "busy": round(float(row[0]) / 1000 / (WORKERS * span), 4),
        "capacity_used": round(float(row[1]) / (cap * span), 4),
        "mean_batch": round(float(row[1]) / max(1, int(row[2])), 1),
    }


def overheads(results: dict[str, RunResult]) -> Overheads:
    """The path's costs outside the model, as this run measured them (medians, ms)."""
    queue, persist, rest = [], [], []
    for r in results.values():
        for s in r.ok:
            t = (s.body or {}).get("timings") or {}
            if None in (t.get("queue_ms"), t.get("persist_ms"), t.get("compute_ms")):
                continue
            queue.append(t["queue_ms"])
            persist.append(t["persist_ms"])
            inside = t["queue_ms"] + t["batch_wait_ms"] + t["compute_ms"] + t["persist_ms"]
            rest.append(max(0.0, s.latency_ms - inside))
    return Overheads(
        kafka_ms=statistics.median(queue) if queue else 6.0,
        persist_ms=statistics.median(persist) if persist else 3.0,
        answer_ms=statistics.median(rest) if rest else 3.0,
    )


def twin(
    batch_ms: float, max_batch: int, rate: float, seconds: float, ov: Overheads
) -> dict[str, Any]:
    """The simulator on the same shape and traffic (evenly spaced, as the generator)."""
    streams = [
        Stream(tier, tier, rate * share, count=int(rate * share * seconds))
        for tier, share in MIX.items()
    ]
    sc = Scenario(
        cost=CostCurve.flat(batch_ms, max_batch),
        streams=streams,
        workers=WORKERS,
        seconds=seconds,
        overheads=ov,
    )
    r = simulate(sc)
    return {
        "tiers": {t: r.tiers[t].row() for t in MIX},
        "busy": round(r.busy(), 4),
        "capacity_used": round(r.capacity_used(), 4),
    }


def run_shape(
    batch_ms: float, max_batch: int, factor: float, seconds: float, out: Path
) -> dict[str, Any]:
    cap = capacity(batch_ms, max_batch)
    rate = cap * factor
    env = {"GRISTMILL_SIM_BATCH_MS": str(batch_ms), "GRISTMILL_SIM_MAX_BATCH": str(max_batch)}
    with ExitStack() as stack:
        system = sim_system(stack, "gm-overload-", workers=WORKERS, extra_env=env)
        tenants = tier_tenants(system)
        time.sleep(3)  # load reports reach the API
        print(f"{batch_ms:g} ms / {max_batch}: offering {rate:g} req/s ({factor:g}x) ...")
        t0 = time.time()
        results = asyncio.run(offer(system, tenants, rate, seconds))
        t1 = t0 + seconds
        time.sleep(3)
        use = worker_use(system, t0 + min(5.0, seconds / 5), t1, cap)
        stages = {
            tier: stage_percentiles(system, t0, t1, tenant_id=tenants[tier][0]) for tier in MIX
        }
        with make_engine(system.settings.database_url).connect() as conn:
            persisted = {
                tier: conn.execute(
                    select(func.count())
                    .select_from(requests)
                    .where(requests.c.tenant_id == tenants[tier][0])
                ).scalar_one()
                for tier in MIX
            }
    rows = []
    for tier, r in results.items():
        row = {"tier": tier, **r.outcomes()}
        row["refusals"] = refusal_reasons(r)
        # Admitted: produced to Kafka (a row each), then answered 200, 504, or shed by
        # the scheduler before its deadline (503 + Retry-After, decision 62).
        shed = row["refusals"].get("shed", 0)
        accepted = row["served_200"] + row["late_504"] + shed
        row["admitted"] = accepted
        row["late_of_admitted"] = round(row["late_504"] / max(1, accepted), 4)
        row["shed_of_admitted"] = round(shed / max(1, accepted), 4)
        shed_ms = sorted(x.latency_ms for x in r.samples if x.status == 503 and is_shed(x.error))
        row["shed_after_ms_p50"] = round(shed_ms[len(shed_ms) // 2], 1) if shed_ms else None
        row["served_share"] = round(row["served_200"] / max(1, row["offered"]), 4)
        row["slo_ms"] = SLO_MS[tier]
        row["persisted"] = persisted[tier]
        row["lost"] = max(0, accepted - persisted[tier])
        rows.append(row)
    ov = overheads(results)
    sim = twin(batch_ms, max_batch, rate, seconds, ov)
    report = {
        "shape": {"batch_ms": batch_ms, "max_batch": max_batch, "workers": WORKERS},
        "capacity_rps": cap,
        "offered_rps": rate,
        "seconds": seconds,
        "mix": MIX,
        "tiers": rows,
        "workers": use,
        "overheads_ms": ov.__dict__,
        "stages": stages,
        "simulated": sim,
    }
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"overload-{int(batch_ms)}ms-{max_batch}-{stamp}"
    (out / f"{name}.json").write_text(json.dumps(report, indent=2))
    draw(report, out / f"{name}.png")
    return report


def is_shed(message: str | None) -> bool:
    """A 503 of a request admitted and then shed by the scheduler (decision 62)."""
    return "scheduler dropped this request unrun" in (message or "")


def refusal_reasons(r: RunResult) -> dict[str, int]:
    """503s by what their message says (capacity, tier order, deadline, the API's own,
    shed by the scheduler after admission)."""
    out: dict[str, int] = {}
    for s in r.samples:
        if s.status != 503:
            continue
        msg = s.error or ""
        kind = (
            "shed"
            if is_shed(msg)
            else "deadline"
            if "cannot finish within its deadline" in msg
            else "order"
            if "are being refused" in msg
            else "api"
            if "API instance" in msg
            else "capacity"
        )
        out[kind] = out.get(kind, 0) + 1
    return out


def draw(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["tiers"]
    sim = report["simulated"]["tiers"]
    tiers = [r["tier"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
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
    a.scatter(
        tiers,
        [sim[t]["served_share"] or 0 for t in tiers],
        color="k",
        marker="_",
        s=400,
        label="served (simulated)",
        zorder=3,
    )
    a.set(title="outcome share per tier", ylabel="fraction of offered", ylim=(0, 1.05))
    a.legend(fontsize=7)
    x = range(len(tiers))
    b.bar([i - 0.2 for i in x], [r["p95_ms"] for r in rows], 0.4, label="measured p95")
    b.bar([i + 0.2 for i in x], [sim[t]["p95_ms"] for t in tiers], 0.4, label="simulated p95")
    b.scatter(list(x), [r["slo_ms"] for r in rows], color="red", marker="_", s=600, label="SLO")
    b.set_xticks(list(x), tiers)
    b.set(title="p95 latency of served requests", ylabel="ms")
    b.legend(fontsize=7)
    shape = report["shape"]
    w = report["workers"]
    factor = report["offered_rps"] / report["capacity_rps"]
    fig.suptitle(
        f"sim {shape['batch_ms']:g} ms / {shape['max_batch']} per batch, {WORKERS} workers: "
        f"{report['offered_rps']:g} req/s offered ({factor:g}x); "
        f"workers busy {w['busy']:.0%}, capacity used {w['capacity_used']:.0%}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_report(rep: dict[str, Any]) -> None:
    s = rep["shape"]
    print(
        f"\n{s['batch_ms']:g} ms / {s['max_batch']}: capacity {rep['capacity_rps']:g}/s, "
        f"offered {rep['offered_rps']:g}/s; workers {rep['workers']}; "
        f"overheads { ({k: round(v, 1) for k, v in rep['overheads_ms'].items()}) }"
    )
    print(
        f"{'tier':<11}{'offered':>8}{'200':>7}{'503':>7}{'504':>6}{'admitted':>9}"
        f"{'504/adm':>8}{'shed/adm':>9}{'share':>7}{'sim':>7}"
        f"{'p50':>8}{'p95':>8}{'sim95':>8}{'p99':>8}{'RA':>4}{'lost':>6}  refusals"
    )
    for r in rep["tiers"]:
        sim = rep["simulated"]["tiers"][r["tier"]]
        print(
            f"{r['tier']:<11}{r['offered']:>8}{r['served_200']:>7}{r['shed_503']:>7}"
            f"{r['late_504']:>6}{r['admitted']:>9}{r['late_of_admitted']:>8.1%}"
            f"{r['shed_of_admitted']:>9.1%}{r['served_share']:>7.1%}{sim['served_share']:>7.1%}"
            f"{r['p50_ms']:>8}{r['p95_ms']:>8}{sim['p95_ms']:>8}{r['p99_ms']:>8}"
            f"{'y' if r['retry_after_on_every_shed'] else 'n':>4}{r['lost']:>6}  {r['refusals']}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shapes", default="20:2,100:10,500:50", help="batch_ms:max_batch,...")
    ap.add_argument("--factor", type=float, default=3.0, help="offered load / capacity")
    ap.add_argument("--seconds", type=float, default=40)
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    reports = []
    for shape in args.shapes.split(","):
        ms, _, mb = shape.partition(":")
        rep = run_shape(float(ms), int(mb), args.factor, args.seconds, args.out)
        print_report(rep)
        reports.append(rep)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"overload-shapes-{stamp}.json").write_text(json.dumps(reports, indent=2))
    print(f"\nreports in {args.out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
