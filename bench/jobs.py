"""Job throughput and the cost of backfill to sync traffic.

    python -m bench.jobs --items 1000000            # submission + end-to-end job throughput
    python -m bench.jobs --backfill 100000 --rate 100 --seconds 30   # sync p95 with/without a job

Starts its own system on loopback (Kafka, PostgreSQL, API, a scheduler with 2
`sim` workers at 100 ms per batch of up to 100: capacity 2,000 items/s), prints
the numbers, writes JSON and a chart under bench-out/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson
from gristmill_client import Client
from sqlalchemy import text
from tqdm import tqdm

from bench.openloop import RunResult, run_open_loop
from bench.stages import stage_percentiles
from bench.system import sim_system
from core.models.sim import sim_output
from gristmill.devservices.stack import System
from results.db import make_engine

CAPACITY = 2 * 100 / 0.100  # 2 workers x 100 items per 100 ms batch


def write_jsonl(path: Path, n: int, tag: str) -> None:
    with path.open("wb") as f:
        for start in range(0, n, 10_000):
            f.write(
                b"".join(
                    orjson.dumps({"input": f"{tag}-{i}"}) + b"\n"
                    for i in range(start, min(n, start + 10_000))
                )
            )


def busy_fraction(system: System, t0: float, t1: float, workers: int) -> float:
    """Share of the window the workers spent computing, from the batches table."""
    with make_engine(system.settings.database_url).connect() as conn:
        ms = conn.execute(
            text(
                "SELECT coalesce(sum(extract(epoch FROM least(compute_end_at, to_timestamp(:t1)) - "
                "greatest(compute_start_at, to_timestamp(:t0))) * 1000), 0) FROM batches "
                "WHERE compute_end_at > to_timestamp(:t0) AND compute_start_at < to_timestamp(:t1)"
            ),
            {"t0": t0, "t1": t1},
        ).scalar()
    return float(ms or 0) / 1000 / ((t1 - t0) * workers)


def job_throughput(system: System, n: int, work: Path) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    src = work / "items.jsonl"
    write_jsonl(src, n, tag)
    gm = Client(system.url, system.keys["enterprise"], timeout_s=3600)
    size = src.stat().st_size
    t0 = time.time()
    with tqdm(total=size, desc="uploading", unit="B", unit_scale=True) as bar:
        job = gm.submit_job("sim", src, on_bytes=bar.update)
    accepted_s = time.time() - t0
    with tqdm(total=n, desc="running", unit="item") as bar:
        done = gm.wait(
            job["job_id"],
            poll_s=1.0,
            on_progress=lambda j: bar.update(j["counts"]["total"] - j["counts"]["queued"] - bar.n),
        )
    finished = time.time()
    created = time.mktime(time.strptime(done["created_at"][:19], "%Y-%m-%dT%H:%M:%S"))
    run_s = finished - t0
    wrong = 0
    checked = 0
    for item in tqdm(gm.iter_results(job["job_id"]), total=n, desc="checking", unit="item"):
        if item["index"] != checked or item["output"] != sim_output(f"{tag}-{checked}"):
            wrong += 1
        checked += 1
    first_batch = done["started_at"]
    return {
        "items": n,
        "bytes": size,
        "submit_s": round(accepted_s, 2),
        "submit_items_per_s": round(n / accepted_s),
        "end_to_end_s": round(run_s, 1),
        "job_items_per_s": round(n / run_s),
        "capacity_items_per_s": CAPACITY,
        "fraction_of_capacity": round(n / run_s / CAPACITY, 3),
        "busy_fraction": round(busy_fraction(system, t0 + accepted_s, finished, 2), 3),
        "status": done["status"],
        "counts": done["counts"],
        "checked": checked,
        "wrong_or_out_of_order": wrong,
        "started_at": first_batch,
        "created": created,
    }


def sync_run(system: System, rate: float, seconds: float, label: str) -> RunResult:
    tag = uuid.uuid4().hex[:6]
    n = int(rate * seconds)
    bar = tqdm(total=n, desc=f"sync {label}", unit="req")
    res = asyncio.run(
        run_open_loop(
            url=f"{system.url}/v1/infer",
            headers=system.headers("enterprise"),
            rate=rate,
            count=n,
            make_body=lambda i: {"model": "sim", "input": f"{tag}-{i}"},
            on_done=lambda s: bar.update(1),
        )
    )
    bar.close()
    return res


def backfill(system: System, items: int, rate: float, seconds: float, work: Path) -> dict[str, Any]:
    a0 = time.time()
    alone = sync_run(system, rate, seconds, "alone")
    a1 = time.time()
    tag = uuid.uuid4().hex[:6]
    src = work / "backfill.jsonl"
    write_jsonl(src, items, tag)
    gm = Client(system.url, system.keys["free"], timeout_s=3600)
    job = gm.submit_job("sim", src)
    time.sleep(2)  # let the job fill the workers
    t0 = time.time()
    during = sync_run(system, rate, seconds, "with job")
    t1 = time.time()
    busy = busy_fraction(system, t0, t1, 2)
    gm.cancel(job["job_id"])
    return {
        "rate": rate,
        "seconds": seconds,
        "job_items": items,
        "alone": alone.summary(),
        "with_job": during.summary(),
        "busy_fraction_during_job": round(busy, 3),
        "p95_ratio": round(during.percentile(95) / alone.percentile(95), 3),
        "stages_alone": stage_percentiles(system, a0, a1, priority="enterprise"),
        "stages_with_job": stage_percentiles(system, t0, t1, priority="enterprise"),
    }


def draw(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    b = report.get("backfill")
    if b:
        names = ["p50_ms", "p95_ms", "p99_ms"]
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [b["alone"][k] for k in names], 0.4, label="sync alone")
        ax.bar(
            [x + 0.2 for x in xs],
            [b["with_job"][k] for k in names],
            0.4,
            label=f"sync + {b['job_items']:,}-item job (busy {b['busy_fraction_during_job']:.0%})",
        )
        ax.set_xticks(list(xs), ["p50", "p95", "p99"])
        ax.set_ylabel("sync latency (ms)")
        ax.set_title(f"sync at {b['rate']:g} req/s, with and without a backfilling job")
        ax.legend()
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--items", type=int, default=0, help="job size for the throughput run")
    ap.add_argument("--backfill", type=int, default=0, help="job size for the backfill run")
    ap.add_argument("--rate", type=float, default=100)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    with ExitStack() as stack:
        system = sim_system(stack, "gm-jobs-")
        work = system.workdir
        if args.items:
            report["throughput"] = job_throughput(system, args.items, work)
            print(json.dumps(report["throughput"], indent=2))
        if args.backfill:
            report["backfill"] = backfill(system, args.backfill, args.rate, args.seconds, work)
            print(json.dumps(report["backfill"], indent=2))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"jobs-{stamp}.json").write_text(json.dumps(report, indent=2))
    if "backfill" in report:
        draw(report, args.out / f"jobs-backfill-{stamp}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
