"""The real embedding model on this machine: raw rate, sync traffic at half of it, a job.

    python -m bench.embedding --workers 1 --sync-seconds 30 --job-items 2000

1. The raw rate: the model in this process, idle, on short texts (8-24 tokens), at
   batch sizes 1..64 (median of repeated runs; items/s).
2. A system (its own Kafka, PostgreSQL, API, a scheduler with ``--workers`` workers
   serving all-minilm-l6-v2 only). Sync requests of short texts at ``--share`` of the
   best raw rate, open loop: every one should be served (nothing refused) in batches
   of more than one item.
3. A job of ``--job-items`` short texts through the jobs API: items/s from submission
   to completion against the raw rate.

Prints and writes JSON under ``--out``; the batch sizes come from the ``batches`` table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import tempfile
import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from gristmill_client import Client
from sqlalchemy import text

from bench.openloop import run_open_loop
from core.config import Settings
from core.models.catalog import build_specs
from gristmill.devservices.stack import System, build_system, local_services
from results.db import make_engine
from results.load import live_reports_stmt
from workers.models.embedding.warmup import synthetic_texts
from workers.models.loader import load_model

MODEL = "all-minilm-l6-v2"
SIZES = (1, 2, 4, 8, 16, 32, 64)


def short_texts(n: int, seed: int) -> list[str]:
    from core.models.text_tokenizer import shared_tokenizer

    tok = shared_tokenizer(None, 256)
    assert tok is not None
    return synthetic_texts(tok, n, 8, 24, seed=seed)


def raw_rate(repeats: int = 5) -> dict[str, Any]:
    """Items/s of the model in this process at each batch size (median of ``repeats``)."""
    settings = Settings()
    model = load_model(build_specs(settings)[MODEL]["1"], settings)
    texts = short_texts(max(SIZES), seed=11)
    out: dict[int, float] = {}
    for n in SIZES:
        batch = texts[:n]
        model.predict(batch, {"normalize": True})
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.predict(batch, {"normalize": True})
            runs.append(time.perf_counter() - t0)
        out[n] = n / statistics.median(runs)
    best4 = max(v for k, v in out.items() if k >= 4)
    return {
        "items_per_s": {k: round(v, 1) for k, v in out.items()},
        "one_at_a_time": round(out[1], 1),
        "best": round(best4, 1),
        "torch_threads": _torch_threads(),
        "load_average": os.getloadavg(),
    }


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def batches(system: System, t0: float, t1: float) -> dict[str, Any]:
    with make_engine(system.settings.database_url).connect() as conn:
        rows = conn.execute(
            text(
                "SELECT size, compute_ms FROM batches WHERE model = :m AND "
                "compute_start_at BETWEEN to_timestamp(:a) AND to_timestamp(:b)"
            ),
            {"m": MODEL, "a": t0, "b": t1},
        ).all()
    sizes = [int(r[0]) for r in rows]
    busy_s = sum(float(r[1] or 0) for r in rows) / 1000
    return {
        "batches": len(sizes),
        "mean_size": round(statistics.mean(sizes), 2) if sizes else 0,
        "max_size": max(sizes, default=0),
        "share_of_one": round(sum(s == 1 for s in sizes) / len(sizes), 3) if sizes else None,
        "compute_s": round(busy_s, 2),
    }


def capacity_trace(system: System, stop: threading.Event, out: list[dict[str, Any]]) -> None:
    """The schedulers' reported capacity record for the model, every half second."""
    s = system.settings
    engine = make_engine(s.database_url)
    t0 = time.time()
    while not stop.wait(0.5):
        with engine.connect() as conn:
            rows = conn.execute(live_reports_stmt(s.load_report_stale_s, s.topic_prefix)).all()
        for r in rows:
            rec = r.capacity.get(f"{MODEL}@1")
            if rec:
                back = r.backlog.get(f"{MODEL}@1", {})
                out.append({"t": round(time.time() - t0, 1), **rec, "queued": sum(back.values())})


def sync(system: System, rate: float, seconds: float) -> dict[str, Any]:
    texts = short_texts(int(rate * seconds), seed=int(time.time()))
    trace: list[dict[str, Any]] = []
    stop = threading.Event()
    watcher = threading.Thread(target=capacity_trace, args=(system, stop, trace), daemon=True)
    watcher.start()
    t0 = time.time()
    res = asyncio.run(
        run_open_loop(
            url=f"{system.url}/v1/infer",
            headers=system.headers("paid"),
            rate=rate,
            count=len(texts),
            timeout_s=60,
            make_body=lambda i: {"model": MODEL, "input": texts[i]},
        )
    )
    t1 = time.time()
    stop.set()
    watcher.join()
    out = res.outcomes()
    sizes = [s.body["batch_size"] for s in res.ok if s.body and s.body.get("batch_size")]
    out["mean_batch_size_seen"] = round(statistics.mean(sizes), 2) if sizes else 0
    out["refusals"] = dict(
        Counter(
            re.sub(r"[0-9a-f-]{36}|[0-9.]+", "N", s.error or "")
            for s in res.samples
            if s.status != 200
        ).most_common(5)
    )
    out["batches"] = batches(system, t0, t1)
    out["capacity_reported"] = trace[::4]  # every 2 s
    return out


def job(system: System, n: int, work: Path, raw_best: float) -> dict[str, Any]:
    src = work / "job.jsonl"
    texts = short_texts(n, seed=int(time.time()) + 1)
    src.write_text("".join(json.dumps({"input": t}) + "\n" for t in texts))
    gm = Client(system.url, system.keys["enterprise"], timeout_s=600)
    t0 = time.time()
    submitted = gm.submit_job(MODEL, src)
    done = gm.wait(submitted["job_id"], poll_s=0.5)
    t1 = time.time()
    rate = n / (t1 - t0)
    return {
        "items": n,
        "status": done["status"],
        "counts": done["counts"],
        "seconds": round(t1 - t0, 2),
        "items_per_s": round(rate, 1),
        "fraction_of_raw": round(rate / raw_best, 3),
        "batches": batches(system, t0, t1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--share", type=float, default=0.5, help="sync rate / best raw rate")
    ap.add_argument("--rates", default="", help="sync rates to run instead (req/s, a,b,...)")
    ap.add_argument("--sync-seconds", type=float, default=30)
    ap.add_argument("--job-items", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    raw = raw_rate()
    print(f"raw (in process, idle): {raw}")
    report: dict[str, Any] = {"raw": raw, "workers": args.workers}
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gm-embed-")))
        services = stack.enter_context(local_services(work))
        system = build_system(services, work)
        stack.callback(system.close)
        system.start_scheduler(workers=args.workers, models=MODEL)
        system.url = system.start_api()
        system.wait_until_serving(MODEL)
        time.sleep(3)  # the workers' warm-up curves are in the load reports
        rates = [float(r) for r in args.rates.split(",")] if args.rates else []
        rates = rates or [args.share * raw["best"]]
        report["sync"] = []
        for rate in rates:
            print(f"sync: {rate:.0f} req/s of short texts for {args.sync_seconds:g} s ...")
            run = {"rate": round(rate, 1), **sync(system, rate, args.sync_seconds)}
            report["sync"].append(run)
            print(json.dumps(run, indent=1))
            time.sleep(3)  # the queue drains before the next
        print(f"job: {args.job_items} short texts ...")
        report["job"] = job(system, args.job_items, work, raw["best"])
        print(json.dumps(report["job"], indent=1))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = args.out / f"embedding-{stamp}-{uuid.uuid4().hex[:4]}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"report {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
