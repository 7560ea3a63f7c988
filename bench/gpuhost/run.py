"""The whole system on one GPU host, measured end to end (issue 28).

Runs on the GPU machine after ``bench/gpuhost/device.sh`` unpacked the bundle: three
Kafka brokers (KRaft, replication 3, min ISR 2), PostgreSQL with fsync and synchronous
commits, then ``gristmill host`` (the command a user runs: API processes, schedulers and
one worker per GPU, shaped from the host's cores), and load from an open-loop generator
on the same host, its CPU counted. Nothing is stubbed.

Scenarios (``--scenarios``, in order):
  sync   open-loop sync requests at each ``--rates`` for ``--seconds``, on each route of
         ``--wires`` (/v1/infer, /v1/embeddings): every answer checked against the
         model's own vector for its input, latency percentiles, refused and late counts,
         CPU per request by process kind, GPU busy (NVML)
  job    a ``--job-items`` embedding job (JSONL upload) of mixed lengths: items/s from the
         first byte to the last row, against the model's raw ceiling for the same inputs
         measured in this process first; GPU busy; sampled answers checked
  mixed  the same job with sync traffic at ``--beside-rate`` beside it: sync p95 against
         its value alone
  faults the job and sync traffic while the GPU worker, then a scheduler, then an API
         process are killed (SIGKILL; ``gristmill host`` starts each again): nothing
         lost or duplicated, answers right, the time each took to recover its rate
         (bench/gpuhost/faults.py)
  generation  gristmill-lm through /v1/completions (streamed), closed loop at each
         ``--gen-streams`` for ``--gen-seconds``, continuous then static batching (the
         host restarted between them): TTFT, inter-token gaps, tokens/s, errors, GPU
         busy, and the continuous/static ratios (bench/gpuhost/generation.py)

    python3 -m bench.gpuhost.run --out $OUT --scenarios sync,job
    python3 -m bench.gpuhost.run --out $OUT --scenarios generation --gen-streams 64,256
    # then, here: .venv/bin/python -m bench.gpuhost.plot gpuhost.json --out docs/bench/gpuhost
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import corpus
from bench.gpuhost.corpora import MODEL, build_corpora
from bench.gpuhost.faults import faults_scenario
from bench.gpuhost.generation import generation_scenario, stack_env
from bench.gpuhost.genload import LM
from bench.gpuhost.measure import (
    SPY_MODES,
    GpuBusy,
    PgWaits,
    cpu_delta,
    machine,
    profile,
    sync_stages_by_second,
    tokenizer_costs,
)
from bench.gpuhost.stack import Stack, log
from bench.openloop import LoadSpec, run_load

ROUTES = {"infer": "/v1/infer", "embeddings": "/v1/embeddings"}
KINDS = ("api", "scheduler", "worker")


def sync_scenario(
    stack: Stack, work: Path, args: argparse.Namespace, gpu: GpuBusy
) -> list[dict[str, Any]]:
    rows = []
    cpu = stack.cpu()

    def load(wire: str, rate: float, seconds: float) -> LoadSpec:
        return LoadSpec(
            url=stack.url + ROUTES[wire],
            headers=stack.headers(),
            rate=rate,
            duration_s=seconds,
            tag=uuid.uuid4().hex[:6],
            model=MODEL,
            timeout_s=30.0,
            corpus=str(work / "short"),
            wire=wire,
            client="raw",
        )

    for wire in args.wires.split(","):
        for i, rate in enumerate(float(r) for r in args.rates.split(",")):
            procs = max(2, min(args.loadgen_cores * 2, round(rate / 2500) + 1))
            if i == 0 and args.sync_warmup > 0:
                # Not recorded: a fresh host's first seconds of load (the brokers' JIT,
                # the first connections, pages of the code and the corpus) are not its
                # steady state, and used to be the first rate's tail.
                run_load(load(wire, rate, args.sync_warmup), processes=procs)
                time.sleep(2)
            spec = load(wire, rate, args.seconds)
            a, t0 = cpu.sample(), time.time()
            spied: dict[str, Any] = {}
            timer: threading.Timer | None = None
            if args.profile and rate == max(float(r) for r in args.rates.split(",")):
                # The busiest process of each kind (an API's children include
                # multiprocessing's idle resource tracker), sampled mid-run.
                timer = threading.Timer(
                    args.seconds / 3,
                    lambda got=spied: got.update(
                        profile(
                            {k: cpu.busiest(k) for k in KINDS if cpu.pids(k)},
                            min(10.0, args.seconds / 2),
                        )
                    ),
                )
                timer.start()
            with PgWaits(stack.dsn()) as waits:
                res = run_load(spec, processes=procs)
            b, t1 = cpu.sample(), time.time()
            if timer is not None:
                timer.join()
            summary = res.summary()
            time.sleep(1.5)  # the API writes its refusal counts about once a second
            row = {
                "refused": stack.refusals(t0, time.time()),
                "wire": wire,
                **summary,
                "cpu": cpu_delta(a, b, summary["requests"]),
                "gpu_busy": gpu.mean(t0, t1),
                "pg_waits": waits.summary(),
                "profile": spied,
            }
            rows.append(row)
            log(
                f"sync {wire} {rate:.0f}/s: {summary['statuses']} {row['refused']} p50/p95/p99 "
                f"{summary['p50_ms']}/{summary['p95_ms']}/{summary['p99_ms']} ms, "
                f"wrong {summary['wrong_outputs']}, cores {row['cpu']['cores']}, answers' "
                f"notify queue max {row['pg_waits']['notify_queue_mb']['max']} MiB, "
                f"SLRU pages {row['pg_waits']['notify_slru_pages']}, "
                f"respond p50 {summary['stages_ms'].get('respond_ms', {}).get('p50')} ms"
            )
            time.sleep(2)
    return rows


def job_scenario(
    stack: Stack,
    work: Path,
    gpu: GpuBusy,
    ceiling: dict[str, Any],
    beside: Callable[[], dict[str, Any]] | None = None,
    spy: bool = False,
    spy_mode: str = "cpu",
    parts: int = 1,
) -> dict[str, Any]:
    """The job file submitted whole, or as ``parts`` jobs of consecutive items submitted
    at once (to several API processes: what a parallel intake would give)."""
    import numpy as np
    import psycopg
    from gristmill_client import Client

    from gristmill.cli.host import host_gpus

    gpus = max(1, len(host_gpus()))

    path = work / "job.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    n = len(lines)
    size = -(-n // parts)
    paths = [path] if parts == 1 else []
    for k in range(0, n, size) if parts > 1 else ():
        paths.append(work / f"job.part{len(paths)}.jsonl")
        paths[-1].write_bytes(b"".join(lines[k : k + size]))
    del lines
    client = Client(stack.url, stack.keys["paid"], timeout_s=3600)
    cpu = stack.cpu()
    a, t0 = cpu.sample(), time.time()
    side: dict[str, Any] = {}
    spied: dict[str, Any] = {}
    timer = None
    if spy:  # the intake (the API taking the upload), then the flow (a scheduler, the worker)

        def spy_both() -> None:
            spied["intake"] = profile({"api": cpu.busiest("api")}, 10.0)
            time.sleep(5.0)
            spied["flow"] = profile(
                {k: cpu.busiest(k) for k in ("scheduler", "worker")}, 10.0, spy_mode
            )

        timer = threading.Timer(3.0, spy_both)
        timer.start()
    th = None
    if beside is not None:
        th = threading.Thread(target=lambda: side.update(beside()), daemon=True)
        th.start()
    with ThreadPoolExecutor(len(paths)) as pool:  # a client (a connection) each
        ids = list(
            pool.map(
                lambda p: Client(stack.url, stack.keys["paid"], timeout_s=3600).submit_job(
                    MODEL, p
                )["job_id"],
                paths,
            )
        )
    accepted_s = time.time() - t0
    log(f"job {ids}: {n} items accepted in {accepted_s:.1f} s")
    dsn = stack.dsn()
    with PgWaits(dsn) as waits, psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM jobs WHERE job_id = ANY(%s) AND finished_at IS NOT NULL",
                (ids,),
            ).fetchone()
            if row and row[0] == len(ids):
                break
            time.sleep(0.5)
        recorded = conn.execute(  # the last part's staging
            "SELECT extract(epoch FROM max(created_at)) FROM jobs WHERE job_id = ANY(%s)", (ids,)
        ).fetchone()[0]  # type: ignore[index]
        first, last, done = conn.execute(
            "SELECT min(consumed_at), max(persisted_at), count(*) FROM requests "
            "WHERE job_id = ANY(%s) AND status = 'succeeded'",
            (ids,),
        ).fetchone()  # type: ignore[misc]
        batches, mean_batch = conn.execute(
            "SELECT count(*), avg(size) FROM batches WHERE formed_at >= to_timestamp(%s)", (t0,)
        ).fetchone()  # type: ignore[misc]
        stages = batch_stages(conn, t0)
    b = cpu.sample()
    if th is not None:
        th.join()
    if timer is not None:
        timer.join()
    t_last = last.timestamp()
    wall = t_last - t0
    sample = np.load(work / "job.sample.npy")
    refs = np.load(work / "job.vectors.npy")
    wrong = 0
    for k, idx in enumerate(sample.tolist()):
        part, local = divmod(idx, size)
        items = client._request(
            "GET", f"/v1/jobs/{ids[part]}/items", params={"cursor": local, "limit": 1}
        ).json()["items"]
        got = items[0].get("output") if items else None
        vec = np.asarray(got if got is not None else [], dtype=np.float32)
        if vec.shape != refs[k].shape or corpus.cosine(vec, refs[k]) < corpus.MIN_COSINE:
            wrong += 1
    checked = len(sample)
    result = {
        "items": n,
        "parts": len(ids),
        "succeeded": done,
        "accept_s": round(accepted_s, 1),
        # The upload read, checked and staged (the job's row is written when it is), then
        # the COPY and the publish to Kafka until the 202; the first item a scheduler took.
        "staged_s": round(float(recorded) - t0, 1),
        "first_consumed_s": round(first.timestamp() - t0, 1),
        "first_byte_to_last_row_s": round(wall, 1),
        "items_per_s": round(n / wall),
        "flowing_items_per_s": round(done / max(1e-3, t_last - first.timestamp())),
        # The ceiling is one GPU's: a host of several is held to that times its GPUs.
        "gpus": gpus,
        "ceiling_items_per_s": ceiling.get("items_per_s"),
        "of_ceiling": round(n / wall / ceiling["items_per_s"] / gpus, 3) if ceiling else None,
        "gpu_busy": gpu.mean(t0 + accepted_s, t_last),
        "pg_waits": waits.summary(),
        "gpu_busy_series": gpu.series(t0, t_last),
        "batches": batches,
        "mean_batch": round(float(mean_batch or 0), 1),
        "batch_stages_ms": stages,
        "checked": checked,
        "wrong": wrong,
        "cpu": cpu_delta(a, b, n),
    }
    if side:
        result["beside"] = side
    if spied:
        result["profile"] = spied
    log(f"job: {json.dumps({k: v for k, v in result.items() if k != 'gpu_busy_series'})}")
    return result


def batch_stages(conn: Any, t0: float) -> dict[str, list[float]]:
    """Where a job's batch spends its time (ms, median and p90 over the job's batches):
    formed until its computation starts (the wait on the worker, the trip there),
    computing (from its launch, or the end of the batch before it, to its outputs on the
    host), computed until its rows are committed (the way back, the persist), and the
    time between one computation's end and the next one's start (one worker: the host's
    GPU)."""
    spans = {
        "formed_to_start": "compute_start_at - formed_at",
        # its three parts (migration 0030), as measure.DISPATCH_PARTS splits a request's
        "to_worker": "worker_received_at - formed_at",
        "worker_queue": "launched_at - worker_received_at",
        "device_queue": "compute_start_at - launched_at",
        "computing": "compute_end_at - compute_start_at",
        "end_to_persisted": "persisted_at - compute_end_at",
        "worker_idle": "greatest(next_start - compute_end_at, interval '0')",
    }
    out: dict[str, list[float]] = {}
    for name, span in spans.items():
        row = conn.execute(
            "WITH b AS (SELECT *, lead(compute_start_at) OVER (ORDER BY compute_start_at) "
            "AS next_start FROM batches WHERE formed_at >= to_timestamp(%s) "
            "AND compute_start_at IS NOT NULL) SELECT percentile_cont(ARRAY[0.5, 0.9]) "
            f"WITHIN GROUP (ORDER BY extract(epoch FROM {span}) * 1000) FROM b "
            f"WHERE {span} IS NOT NULL",
            (t0,),
        ).fetchone()
        out[name] = [round(float(x), 1) for x in (row[0] or [])]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench-out")))
    ap.add_argument("--scenarios", default="sync,job")
    ap.add_argument("--rates", default="1000,2500,5000,10000")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--wires", default="infer,embeddings")
    ap.add_argument("--job-items", type=int, default=1_000_000)
    ap.add_argument("--job-parts", type=int, default=1, help="submitted as this many jobs at once")
    ap.add_argument("--sync-texts", type=int, default=20_000)
    ap.add_argument(
        "--sync-warmup", type=float, default=5.0, help="s of unrecorded load before each wire"
    )
    ap.add_argument("--ceiling-items", type=int, default=65_536)
    ap.add_argument("--beside-rate", type=float, default=2000.0)
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--loadgen-cores", type=int, default=3)
    ap.add_argument("--schedulers", type=int, default=0, help="0: as gristmill host shapes it")
    ap.add_argument("--api-processes", type=int, default=0, help="0: as gristmill host shapes it")
    ap.add_argument("--workers-per-gpu", type=int, default=1)
    ap.add_argument(
        "--pg-conf",
        choices=("default", "host"),
        default="default",
        help="PostgreSQL sized for the host (gristmill/devservices/pg_sizing.py) or its defaults",
    )
    ap.add_argument("--profile", action="store_true", help="py-spy at the top rate and in the job")
    ap.add_argument(
        "--profile-mode",
        choices=sorted(SPY_MODES),
        default="cpu",
        help="with --profile, how the job's flow is sampled: the threads on a CPU, the "
        "thread holding the interpreter lock (gil), or every thread waiting too (threads)",
    )
    ap.add_argument("--fault-at", default="20,50,80", help="seconds: worker, scheduler, API")
    ap.add_argument("--fault-seconds", type=float, default=110.0, help="sync load under faults")
    ap.add_argument("--gen-streams", default="64,256", help="concurrent completion streams")
    ap.add_argument("--gen-seconds", type=float, default=60.0, help="each stream count, each mode")
    ap.add_argument("--gen-modes", default="continuous,static")
    ap.add_argument("--gen-warmup", type=float, default=10.0, help="s of load before each mode")
    ap.add_argument("--gen-prompts", type=int, default=4096, help="seeded prompts, sent in turn")
    ap.add_argument("--gen-seed", type=int, default=28)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gmhost-"))
    work.chmod(0o755)
    result: dict[str, Any] = {
        "machine": machine(),
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    out_file = args.out / "gpuhost.json"

    def save() -> None:
        out_file.write_text(json.dumps(result, indent=1, default=str))

    scenarios = args.scenarios.split(",")
    gpu = GpuBusy()
    stack = Stack(work, args)
    if "generation" in scenarios:
        stack.models = f"{MODEL},{LM}"
        stack.extra_env = stack_env(args)
    if args.job_parts > 2 and not os.environ.get("GRISTMILL_MAX_UPLOADS_PER_TENANT"):
        # A key may stage 2 uploads at once on an instance by default: the parts of a
        # job submitted in parallel would otherwise wait out 429s (r12 and r14 did).
        parts = str(args.job_parts)
        stack.extra_env |= {"GRISTMILL_MAX_UPLOADS_PER_TENANT": parts}
        if args.job_parts > 8:
            stack.extra_env["GRISTMILL_MAX_UPLOADS"] = parts
    try:
        if set(scenarios) - {"generation"}:  # the embedding model's inputs and ceiling
            result.update(build_corpora(work, args))
            log(f"corpora and ceiling: {result['ceiling']}")
            result["tokenizer"] = tokenizer_costs(
                {
                    "short": corpus.read_texts(work / "short")[:20000],
                    "job": [json.loads(x)["input"] for x in (work / "job.jsonl").open()][:20000],
                },
                os.environ["GRISTMILL_EMBED_MODEL_DIR"],
            )
            log(f"tokenizer: {result['tokenizer']}")
            save()
        result["system"] = stack.start()
        save()
        if "sync" in scenarios:
            result["sync"] = sync_scenario(stack, work, args, gpu)
            save()
        if "job" in scenarios:
            result["job"] = job_scenario(
                stack,
                work,
                gpu,
                result["ceiling"],
                spy=args.profile,
                spy_mode=args.profile_mode,
                parts=args.job_parts,
            )
            save()
        if "mixed" in scenarios:
            alone = _sync_at(stack, work, args, args.beside_rate)
            result["mixed"] = {
                "alone": alone,
                "job": job_scenario(
                    stack, work, gpu, result["ceiling"],
                    beside=lambda: _sync_at(stack, work, args, args.beside_rate),
                ),
            }  # fmt: skip
            save()
        if "faults" in scenarios:
            result["faults"] = faults_scenario(stack, work, args)
            save()
        if "generation" in scenarios:  # last: it restarts the host in each mode
            result["generation"] = generation_scenario(stack, args, gpu)
            save()
    finally:
        stack.stop()
        save()
        logs = args.out / "logs.tar.gz"
        with contextlib.suppress(Exception):
            subprocess.run(
                ["tar", "-czf", str(logs), "-C", str(work), "--exclude=*.jsonl",
                 "--exclude=*.npy", "--exclude=data", "."],
                check=False,
            )  # fmt: skip
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _sync_at(stack: Stack, work: Path, args: argparse.Namespace, rate: float) -> dict[str, Any]:
    spec = LoadSpec(
        url=stack.url + ROUTES["infer"],
        headers=stack.headers(),
        rate=rate,
        duration_s=args.seconds,
        tag=uuid.uuid4().hex[:6],
        model=MODEL,
        timeout_s=30.0,
        corpus=str(work / "short"),
        wire="infer",
        client="raw",
    )
    import psycopg

    t0 = time.time()
    summary = run_load(spec, processes=3).summary()
    t1 = time.time()
    time.sleep(2.0)  # the last answers' rows committed
    with psycopg.connect(stack.dsn(), autocommit=True) as conn:
        summary["stages_by_s"] = sync_stages_by_second(conn, t0, t1)
    return summary


if __name__ == "__main__":
    sys.exit(main())
