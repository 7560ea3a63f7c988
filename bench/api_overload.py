"""Overload where the API is what runs out: one API process held to a fraction of a core.

    python -m bench.api_overload --cpu 0.3 --factors 0.7,1.5,3 --seconds 20

A GPU host past its capacity is short of API CPU, not of GPU time (r14, r15 in
docs/bench/gpu-host.md: at 15,000 req/s the answered rate fell to a fifth of what the
host answers at 12,500, and as many admitted requests ended 504 as were refused). The
development box cannot show that with a load generator beside the API on 2 cores; a CPU
limit on the API process can (the way a Kubernetes CPU limit holds a pod): Linux's CFS
quota on a cgroup (v1 ``cpu`` or v2), ``--cpu`` cores over a 10 ms period. Workers are a
fast ``sim`` (far above the API's rate), so only the API can be the limit.

It measures the API's CPU at two low rates (what a request adds, what the process
spends anyway), takes what ``--cpu`` leaves as the API's capacity, then offers
``--factors`` times that for ``--seconds`` each, open loop, in bench.overload's tier mix
(70% free, 25% paid, 5% enterprise, rate limits out of the way). Per factor and tier:
answered a second (goodput), refused (by reason), late (504) against admitted, latency
percentiles. JSON and a chart go to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

import psutil

from bench.openloop import LoadSpec, RunResult, run_load
from bench.overload import offer, refusal_reasons, tier_tenants
from bench.system import sim_system
from gristmill.devservices.stack import System

PERIOD_US = 10_000  # short, so the quota's pauses are short as well


class CpuLimit:
    """A cgroup holding processes to ``cores`` of CPU (CFS quota), removed on close."""

    def __init__(self, name: str, cores: float):
        v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
        self.path = Path("/sys/fs/cgroup" if v2 else "/sys/fs/cgroup/cpu") / name
        self.path.mkdir()
        quota = int(cores * PERIOD_US)
        if v2:
            (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        self.parent = self.path.parent

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def close(self) -> None:
        for pid in (self.path / "cgroup.procs").read_text().split():
            with suppress(OSError):
                (self.parent / "cgroup.procs").write_text(pid)
        with suppress(OSError):
            self.path.rmdir()


def cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def row(tier: str, r: RunResult, seconds: float) -> dict[str, Any]:
    out = r.outcomes()
    reasons = refusal_reasons(r)
    shed = reasons.get("shed", 0)
    admitted = out["served_200"] + out["late_504"] + shed
    return {
        "tier": tier,
        **out,
        "refusals": reasons,
        "admitted": admitted,
        "late_of_admitted": round(out["late_504"] / max(1, admitted), 4),
        "answered_per_s": round(out["served_200"] / seconds, 1),
    }


def pooled(
    system: System, tenants: dict[str, tuple[str, str]], rate: float, seconds: float, conns: int
) -> dict[str, Any]:
    """The paid tenant alone through bench.openloop's raw client: at most ``conns``
    requests in flight (a client's connection pool); what finds none free is counted as
    the client's overflow, not sent."""
    spec = LoadSpec(
        url=f"{system.url}/v1/infer",
        headers={"Authorization": f"Bearer {tenants['paid'][1]}"},
        rate=rate,
        duration_s=seconds,
        tag=f"pooled-{time.monotonic_ns()}",
        max_inflight=max(1, conns // 2),
        client="raw",
    )
    res = run_load(spec, processes=2).summary()
    st = res["statuses"]
    ok, late = st.get("200", 0), st.get("504", 0)
    return {
        "tier": "paid",
        "offered": res["requests"],
        "served_200": ok,
        "late_504": late,
        "refused_503": st.get("503", 0),
        "client_overflow": st.get("client_overflow", 0),
        "statuses": st,
        "admitted": ok + late,
        "late_of_admitted": round(late / max(1, ok + late), 4),
        "answered_per_s": round(ok / seconds, 1),
        "p50_ms": res["p50_ms"],
        "p95_ms": res["p95_ms"],
        "p95_all_ms": res["p95_all_ms"],
        "refusals": {k: v for k, v in st.items() if k != "200"},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", type=float, default=0.3, help="cores the API process may use")
    ap.add_argument("--factors", default="0.7,1.5,3", help="offered load / the API's capacity")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--probe-rps", type=float, default=50, help="the CPU is read at this and 3x")
    ap.add_argument(
        "--connections", type=int, default=0, help="a client pool of this many (0: unbounded)"
    )
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the system")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    a = ap.parse_args(argv)
    env = {"GRISTMILL_SIM_BATCH_MS": "2", "GRISTMILL_SIM_MAX_BATCH": "512"}
    env |= dict(x.split("=", 1) for x in a.env)
    report: dict[str, Any] = {"cpu": a.cpu, "seconds": a.seconds, "env": a.env, "runs": []}
    with ExitStack() as stack:
        system = sim_system(stack, "gm-apiover-", workers=2, extra_env=env)
        tenants = tier_tenants(system)
        api = system.procs["api"].pid
        limit = CpuLimit(f"gm-api-{os.getpid()}", a.cpu)
        stack.callback(limit.close)
        limit.add(api)
        time.sleep(3)  # load reports reach the API
        # Its CPU at two rates: what a request adds (the slope) and what the process
        # spends anyway (background tasks, timers), which a low rate alone would charge
        # to its few requests.
        cores = []
        for rate in (a.probe_rps, 3 * a.probe_rps):
            c0, t0 = cpu_s(api), time.monotonic()
            asyncio.run(offer(system, tenants, rate, 8))
            cores.append((cpu_s(api) - c0) / (time.monotonic() - t0))
        ms_per_request = max(0.01, (cores[1] - cores[0]) * 1000 / (2 * a.probe_rps))
        idle = max(0.0, cores[0] - a.probe_rps * ms_per_request / 1000)
        capacity = (a.cpu - idle) * 1000 / ms_per_request
        report |= {
            "api_ms_per_request": round(ms_per_request, 3),
            "api_idle_cores": round(idle, 3),
            "capacity_rps": round(capacity, 1),
        }
        print(
            f"API: {ms_per_request:.2f} ms of CPU a request, {idle:.2f} cores anyway; "
            f"{a.cpu} cores: {capacity:.0f} req/s"
        )
        for factor in (float(x) for x in a.factors.split(",")):
            rate = factor * capacity
            time.sleep(5)  # the last run's leftovers drain
            c0, t0 = cpu_s(api), time.monotonic()
            if a.connections:
                rows = [pooled(system, tenants, rate, a.seconds, a.connections)]
            else:
                results = asyncio.run(offer(system, tenants, rate, a.seconds))
                rows = [row(t, r, a.seconds) for t, r in results.items()]
            used = (cpu_s(api) - c0) / (time.monotonic() - t0)
            run = {
                "factor": factor,
                "offered_rps": round(rate, 1),
                "answered_per_s": round(sum(r["answered_per_s"] for r in rows), 1),
                "late_504": sum(r["late_504"] for r in rows),
                "admitted": sum(r["admitted"] for r in rows),
                "api_cores": round(used, 3),
                "tiers": rows,
            }
            report["runs"].append(run)
            print(
                f"{factor:g}x ({rate:.0f}/s): answered {run['answered_per_s']}/s, "
                f"504 {run['late_504']} of {run['admitted']} admitted, API {used:.2f} cores; "
                + ", ".join(
                    f"{r['tier']} {r['served_200']}/{r['offered']} p95 {r['p95_ms']} "
                    f"{r['refusals']}"
                    for r in rows
                ),
                flush=True,
            )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "api_overload.json").write_text(json.dumps(report, indent=1))
    chart(report, a.out / "api_overload.png")
    return 0


def chart(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = report["runs"]
    x = [r["offered_rps"] for r in runs]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    ax.plot(x, [r["answered_per_s"] for r in runs], marker="o", label="answered 200 /s")
    ax.plot(x, x, ":", color="grey", label="offered")
    ax.axhline(report["capacity_rps"], color="grey", lw=0.8, label="API capacity (CPU)")
    ax.set(xlabel="offered requests/s", ylabel="requests/s")
    ax.legend(fontsize=7)
    for tier in sorted({t["tier"] for r in runs for t in r["tiers"]}):
        bx.plot(
            x,
            [
                100 * next(t for t in r["tiers"] if t["tier"] == tier)["late_of_admitted"]
                for r in runs
            ],
            marker="o",
            label=tier,
        )
    bx.set(xlabel="offered requests/s", ylabel="% of admitted answered 504")
    bx.legend(fontsize=7)
    fig.suptitle(f"one API process held to {report['cpu']} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
