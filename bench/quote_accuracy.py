"""How right a job's completion-time quote is (decision 69; issue 32 item 2).

    python -m bench.quote_accuracy --shapes 10:1,300:30 --sizes 1000,10000,50000,200000

Per ``--shapes`` (``sim`` batch ms : batch limit; the two of docs/bench/policy.md that
were not tuned against, batches of one and a slower model) it starts its own system
(Kafka, PostgreSQL, API, a scheduler with 2 ``sim`` workers) and, for each job size
(times ``--scale``, so a small run fits) under each load:

- ``steady``: paid sync traffic at ``--sync-share`` of capacity beside the job,
  open loop, for the whole job;
- ``changing``: the sync rate stepping through ``STEPS`` (shares of capacity) every
  ``--step-s`` seconds, and a second tenant's job of half the size submitted once the
  first is a quarter done;

records the quote at submission (the 202's ``estimated_completion_at``), the quote at
50% progress (polling ``GET /v1/jobs/{id}``) and the job's actual ``finished_at``. The
error of a quote is (quoted - actual finish) / (actual finish - when it was quoted): a
fraction of the remaining time it predicted, positive when it said later than it was.
The quote is whole seconds, so for jobs of a few seconds that rounding alone is a large
fraction: read the absolute error (s) beside it. JSON and a chart go to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
from gristmill_client import Client

from bench.openloop import percentile
from bench.overload import WORKERS, capacity
from bench.system import sim_system
from gristmill.devservices.stack import System
from results.db import make_engine
from results.tenants import create_tenant, issue_key, set_plan

POLL_S = 0.25
WARM_S = 3.0  # sync traffic runs this long before a job: admission's rates have seen it
# The changing load's sync shares of capacity, one every --step-s, round and round.
STEPS = (0.1, 0.5, 0.2, 0.6, 0.1)


def new_key(system: System, tier: str, prefix: str) -> str:
    """A fresh tenant of ``tier`` with its rate limit out of the way: its key."""
    with make_engine(system.settings.database_url).begin() as conn:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        t = create_tenant(conn, name, tier)
        set_plan(conn, name, rate_rps=1e6, burst=1e6)
        return issue_key(conn, t)[1]


def started(stack: ExitStack, shape: str, prefix: str) -> tuple[System, float]:
    """A system of 2 ``sim`` workers of ``shape`` (batch ms : batch limit), its capacity."""
    ms, _, mb = shape.partition(":")
    env = {"GRISTMILL_SIM_BATCH_MS": ms, "GRISTMILL_SIM_MAX_BATCH": mb}
    system = sim_system(stack, prefix, workers=WORKERS, extra_env=env)
    time.sleep(3)  # the load reports (the quote's capacity) reach the API
    return system, capacity(float(ms), int(mb))


class SyncLoad:
    """Open-loop ``/v1/infer`` traffic at ``rate_at(t)`` requests/s (t: seconds since
    start) on a thread of its own until ``stop``; each answer's (t, latency ms, status)."""

    def __init__(self, system: System, key: str, rate_at: Callable[[float], float]) -> None:
        self.url, self.key, self.rate_at = f"{system.url}/v1/infer", key, rate_at
        self.samples: list[tuple[float, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._drive()), daemon=True)

    def __enter__(self) -> SyncLoad:
        self._thread.start()
        time.sleep(WARM_S)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=90)

    async def _drive(self) -> None:
        tag = uuid.uuid4().hex[:6]
        hdrs = {"Authorization": f"Bearer {self.key}"}
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=timeout, headers=hdrs
        ) as client:
            start, due, i = time.perf_counter(), 0.0, 0
            tasks: set[asyncio.Task[None]] = set()

            async def one(at: float, n: int) -> None:
                try:
                    body = {"model": "sim", "input": f"{tag}-{n}"}
                    async with client.post(self.url, json=body) as r:
                        await r.read()
                        status = r.status
                except (aiohttp.ClientError, TimeoutError):
                    status = 0
                self.samples.append((at, (time.perf_counter() - start - at) * 1000, status))

            while not self._stop.is_set():
                rate = self.rate_at(due)
                if rate <= 0:
                    due += 0.1
                else:
                    delay = start + due - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    t = asyncio.create_task(one(due, i))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
                    due, i = due + 1 / rate, i + 1
                if due - (time.perf_counter() - start) > 0.1:
                    await asyncio.sleep(0.05)
            await asyncio.gather(*tasks)

    def p95_ms(self, t0: float = 0.0, t1: float = float("inf")) -> dict[str, Any]:
        """The answers intended in [t0, t1): p50/p95 of the 200s, counts by status."""
        xs = [s for s in self.samples if t0 <= s[0] < t1]
        ok = [s[1] for s in xs if s[2] == 200]
        pct = (lambda q: round(percentile(ok, 100 * q), 1)) if ok else None
        statuses: dict[str, int] = {}
        for s in xs:
            statuses[str(s[2])] = statuses.get(str(s[2]), 0) + 1
        return {
            "p50_ms": pct(0.5) if pct else None,
            "p95_ms": pct(0.95) if pct else None,
            "statuses": statuses,
        }


def items(tag: str, n: int) -> list[str]:
    return [f"{tag} item {i}" for i in range(n)]


def unix(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def measure_job(
    system: System, gm: Client, n: int, on_progress: Callable[[float], None] | None = None
) -> dict[str, Any]:
    """Submit ``n`` items, poll: the quote at submission and at 50%, the finish."""
    job = gm.submit_job("sim", items(uuid.uuid4().hex[:6], n))
    # Quoted as the 202 was made, after its items were published: a small job may have
    # finished by the time the 202 is read here (a negative ``took_s``).
    t_sub, q_sub = time.time(), job.get("estimated_completion_at")
    t50 = q50 = None
    while True:
        j = gm.job(job["job_id"])
        now = time.time()
        if on_progress is not None:
            on_progress(j["progress"])
        if t50 is None and j["progress"] >= 0.5:
            t50, q50 = now, j["estimated_completion_at"]
        if j["finished_at"] or j["status"] in ("cancelled", "expired", "failed"):
            break
        time.sleep(POLL_S)
    end = unix(j["finished_at"]) if j["finished_at"] else now
    return {
        "items": n,
        "status": j["status"],
        "took_s": round(end - t_sub, 2),
        "finished": end,
        "at_submission": quote_error(end, t_sub, q_sub),
        "at_50pct": quote_error(end, t50, q50),
    }


def quote_error(end: float, at: float | None, quote: float | None) -> dict[str, Any] | None:
    """A quote made at ``at`` against the finish ``end``."""
    if at is None or quote is None:
        return None
    actual = max(1e-3, end - at)
    return {
        "quoted_s": round(quote - at, 2),
        "actual_s": round(actual, 2),
        "error_s": round(quote - end, 2),
        "error_frac": round((quote - end) / actual, 4),
        # What rounding up to whole seconds alone may add, as a fraction.
        "rounding_frac": round(1 / actual, 4),
    }


def one_case(
    system: System, cap: float, keys: dict[str, str], n: int, load: str, args: argparse.Namespace
) -> dict[str, Any]:
    job_gm = Client(system.url, keys["job"], timeout_s=3600)
    if load == "steady":
        with SyncLoad(system, keys["sync"], lambda t: cap * args.sync_share):
            return measure_job(system, job_gm, n)
    other = Client(system.url, keys["other"], timeout_s=3600)
    second: dict[str, Any] = {}

    def rate_at(t: float) -> float:
        return cap * STEPS[int(t // args.step_s) % len(STEPS)]

    def on_progress(p: float) -> None:
        if p >= 0.25 and not second:  # the second tenant's job arrives mid-way
            job = other.submit_job("sim", items(uuid.uuid4().hex[:6], max(1, n // 2)))
            second.update(job=job, at=time.time(), quote=job.get("estimated_completion_at"))
        elif second:
            follow()

    def follow() -> dict[str, Any]:
        """How the second job moves, and its quote at 50%: one poll."""
        j2, now = other.job(second["job"]["job_id"]), time.time()
        if j2["progress"] > 0 and "moved_at" not in second:
            second["moved_at"] = now
        if j2["progress"] >= 0.5 and "at50" not in second:
            second["at50"], second["quote50"] = now, j2["estimated_completion_at"]
        return j2

    with SyncLoad(system, keys["sync"], rate_at):
        out = measure_job(system, job_gm, n, on_progress)
    out["second_job"] = second.get("job", {}).get("job_id")
    if out["second_job"]:
        # The next case starts on an empty queue. When the second job finished against
        # the first tells fair sharing (it ends first, being half the size and arriving
        # with the first still 3/4 to go) from the partition's publish order (it ends last).
        while not (j := follow())["finished_at"] and j["status"] not in ("cancelled", "expired"):
            time.sleep(POLL_S)
        end2 = unix(j["finished_at"]) if j["finished_at"] else time.time()
        out["second_ends_after_first_s"] = round(end2 - out["finished"], 2)
        out["second"] = {
            # Seconds from its 202 to its first result (polled with the first job).
            "waited_s": round(second["moved_at"] - second["at"], 2)
            if "moved_at" in second
            else None,
            "at_submission": quote_error(end2, second["at"], second["quote"]),
            "at_50pct": quote_error(end2, second.get("at50"), second.get("quote50")),
        }
    return out


def summary(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Per (shape, load, size): the median error fraction (and |s|) at each point."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in cases:
        if "error" in c:
            continue
        groups.setdefault(f"{c['shape']} {c['load']} {c['items']}", []).append(c)
    out = {}
    for k, cs in groups.items():
        row: dict[str, Any] = {}
        points = [("at_submission", ""), ("at_50pct", "")]
        points += [("at_submission", "second"), ("at_50pct", "second")]
        for point, whose in points:
            got = [(c[whose] if whose else c).get(point) for c in cs if not whose or whose in c]
            xs: list[dict[str, Any]] = [x for x in got if x is not None]
            if whose and not xs:
                continue
            row[f"{whose} {point}".strip()] = (
                {
                    "error_frac": round(statistics.median(x["error_frac"] for x in xs), 4),
                    "error_s": round(statistics.median(x["error_s"] for x in xs), 2),
                }
                if xs
                else None
            )
        out[k] = row
    return out


def draw(report: dict[str, Any], path: Path) -> None:
    draw_many([report], path)


def draw_many(reports: list[dict[str, Any]], path: Path) -> None:
    """Each report's errors against job size, at submission and at 50%; several reports
    (a change and its baseline, ``--compare``) on the same axes, labelled by note."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    markers = iter("osD^v<>phx*")
    for report in reports:
        for shape, load in [(s, ld) for s in report["shapes"] for ld in report["loads"]]:
            marker = next(markers, "o")
            label = f"sim {shape}, {load}"
            if len(reports) > 1:
                label += f": {report['note']}"
            for ax, point in zip(axes, ("at_submission", "at_50pct"), strict=True):
                cs = [
                    c
                    for c in report["cases"]
                    if c["shape"] == shape and c.get("load") == load and c[point]
                ]
                ax.plot(
                    [c["items"] for c in cs],
                    [100 * c[point]["error_frac"] for c in cs],
                    marker=marker,
                    ls="-",
                    label=label,
                )
    for ax, point in zip(axes, ("at_submission", "at_50pct"), strict=True):
        ax.axhspan(-10, 10, color="tab:green", alpha=0.12, label="goal at 50%: within 10%")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set(xscale="log", xlabel="job items", title=f"quote {point.replace('_', ' ')}")
    axes[0].set_ylabel("error, % of the remaining time (+: quoted later)")
    axes[1].legend(fontsize=7)
    title = reports[0]["note"] if len(reports) == 1 else "compared"
    fig.suptitle(f"completion-time quotes: --scale {reports[0]['scale']:g}, {title}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shapes", default="10:1,300:30", help="batch_ms:max_batch of sim, ...")
    ap.add_argument("--sizes", default="1000,10000,50000,200000", help="job items, ...")
    ap.add_argument("--scale", type=float, default=1.0, help="every size times this")
    ap.add_argument("--loads", default="steady,changing")
    ap.add_argument("--sync-share", type=float, default=0.3, help="steady sync / capacity")
    ap.add_argument("--step-s", type=float, default=20.0, help="changing: seconds a step")
    ap.add_argument("--runs", type=int, default=1, help="jobs per (shape, load, size)")
    ap.add_argument("--note", default="", help="a label for the chart (e.g. the box)")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    ap.add_argument(
        "--compare", nargs="+", type=Path, help="draw these reports together into --out (a .png)"
    )
    args = ap.parse_args(argv)
    if args.compare:
        draw_many([json.loads(p.read_text()) for p in args.compare], args.out)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    shapes, loads = args.shapes.split(","), args.loads.split(",")
    sizes = [max(1, round(int(s) * args.scale)) for s in args.sizes.split(",")]
    cases = []
    for shape in shapes:
        with ExitStack() as stack:
            try:
                system, cap = started(stack, shape, "gm-quotes-")
            except RuntimeError as exc:  # a system that did not start: said, not hidden
                print(f"shape {shape}: {exc}", flush=True)
                cases.append({"shape": shape, "error": str(exc)})
                continue
            keys = {
                "job": new_key(system, "enterprise", "quote-job"),
                "other": new_key(system, "enterprise", "quote-other"),
                "sync": new_key(system, "paid", "quote-sync"),
            }
            for load in loads:
                for n in sizes:
                    for _ in range(args.runs):
                        got = one_case(system, cap, keys, n, load, args)
                        c = {"shape": shape, "load": load, **got}
                        print(json.dumps(c), flush=True)
                        cases.append(c)
    report = {
        "shapes": shapes,
        "loads": loads,
        "sizes": sizes,
        "scale": args.scale,
        "sync_share": args.sync_share,
        "steps": STEPS,
        "step_s": args.step_s,
        "note": args.note,
        "summary": summary(cases),
        "cases": cases,
    }
    print(json.dumps(report["summary"], indent=2))
    written(args.out, "quote-accuracy", report, draw)
    return 0


def written(
    out: Path, name: str, report: dict[str, Any], draw: Callable[[dict[str, Any], Path], None]
) -> None:
    """The report as ``name-<stamp>.json`` beside its chart (``.png``) under ``out``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"{name}-{stamp}.json").write_text(json.dumps(report, indent=2))
    draw(report, out / f"{name}-{stamp}.png")
    print(f"report in {out}/{name}-{stamp}.json")


if __name__ == "__main__":
    raise SystemExit(main())
