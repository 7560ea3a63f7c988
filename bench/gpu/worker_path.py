"""The embedding worker as Gristmill runs it, at saturation, against the raw ceiling.

Issue 7 item 3. One run, one JSON, on one GPU:

1. The raw ceiling, measured first in this process: the encoder alone on inputs
   already on the GPU, every row at the workload's mean length, batch ``--max-batch``,
   the better of eager and a CUDA graph (CUDA events, median of 5 groups).
2. Requests as the API tier makes them: each text validated and turned into its
   message input by ``spec.message_input`` (token ids, core/models/token_ids.py).
   Kafka and PostgreSQL cannot run on the GPU machine, so an in-process source stands
   in for the consumer: it keeps the scheduler's real ``Batcher`` (scheduler/core/batcher.py)
   at least ``--depth`` batches deep, and nothing is persisted.
3. The scheduler's own dispatch path, wired as scheduler/runtime/service.py wires it with its
   Kafka lanes, producer and database left out: the dispatch core
   (scheduler/core/dispatch.py, ``DispatchCore``) under one lock; per worker a dispatcher
   thread (``DispatchCore.schedule``: ``Batcher.take`` under the flush rule, then
   ``WorkerHandle.send`` over the real socket protocol to real worker processes spawned
   by ``scheduler/runtime/workerpool.py``) and a receiver thread (``DispatchCore.on_result``:
   results in order, cost model update), scheduler/runtime/worker_threads.py; and the
   persister's pool building the result rows (``succeeded_rows``) and marking offsets
   done (scheduler/runtime/persister.py); only the database write is skipped. Up to two
   batches are in flight per worker when batches are short (decision 0012); ``SxW:1`` runs a
   configuration with one at a time, as before.

Reported per worker count: items/s against the ceiling; GPU busy fraction (one worker:
the sum of its forward passes' CUDA-event times over the wall time; any count: NVML's
kernel-activity counter sampled by a thread); and per batch, the GPU's idle time
(wall - busy) / batches, i.e. what a batch costs outside the forward pass.

    GRISTMILL_EMBED_MODEL_DIR=.modelcache/all-minilm-l6-v2 \\
        python3 bench/gpu/worker_path.py --out $OUT/worker_path.json
    python3 bench/gpu/worker_path.py --plot worker_path.json --plot-out docs/bench
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

MODEL = "all-minilm-l6-v2"


def gpu_env() -> dict[str, Any]:
    import torch

    p = torch.cuda.get_device_properties(0)
    return {
        "gpu": p.name,
        "gpu_mem_gib": round(p.total_memory / 2**30, 1),
        "sms": p.multi_processor_count,
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
    }


def ceiling(model_dir: str, batch: int, seq: int) -> dict[str, Any]:
    """Encoder alone, ``batch`` rows of ``seq`` tokens on the GPU: eager and graph."""
    import torch

    from workers.models.embedding.encoder import Encoder

    dev = torch.device("cuda")
    with torch.inference_mode():
        enc = Encoder(Path(model_dir), dev, torch.float16)
        ids = torch.randint(1000, 29000, (batch, seq), dtype=torch.int32, device=dev)
        lens = torch.full((batch,), seq, dtype=torch.int32, device=dev)

        def timed(fn: Any) -> float:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            reps = max(3, int(25e-3 / max(1e-5, time.perf_counter() - t0)))
            groups = []
            for _ in range(5):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for _ in range(reps):
                    fn()
                b.record()
                b.synchronize()
                groups.append(a.elapsed_time(b) / reps)
            return statistics.median(groups)

        eager_ms = timed(lambda: enc(ids, lens))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            enc(ids, lens)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            enc(ids, lens)
        graph_ms = timed(g.replay)
    gc.collect()
    torch.cuda.empty_cache()
    best = min(eager_ms, graph_ms)
    return {
        "batch": batch,
        "seq": seq,
        "eager_ms": eager_ms,
        "graph_ms": graph_ms,
        "ms": best,
        "items_per_s": batch / best * 1e3,
    }


class NvmlBusy:
    """NVML's utilization.gpu: percent of each sample period in which a kernel ran."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._h = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml: Any = pynvml
        except Exception:
            self._nvml = None

    def start(self) -> None:
        if self._nvml is not None:
            threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            u = self._nvml.nvmlDeviceGetUtilizationRates(self._h).gpu
            self.samples.append((time.perf_counter(), int(u)))

    def mean(self, t0: float, t1: float) -> float | None:
        self._stop.set()
        # Each reading covers the period before it: skip the first after t0.
        xs = [u for t, u in self.samples if t0 + 0.5 <= t <= t1]
        return statistics.mean(xs) / 100 if xs else None


def make_workload(model_dir: str, n: int, lo: int, hi: int, max_tokens: int) -> dict[str, Any]:
    """Texts ``lo``..``hi`` tokens, validated and turned into message inputs as the API does."""
    from core.models.embedding import EmbedSpec
    from core.models.text_tokenizer import shared_tokenizer
    from core.models.token_ids import is_tokenized
    from workers.models.embedding.warmup import synthetic_texts

    spec = EmbedSpec(
        name=MODEL, version="1", max_batch_size=1, tokenizer_dir=model_dir, max_tokens=max_tokens
    )
    tok = shared_tokenizer(model_dir, max_tokens)
    if tok is None:
        raise SystemExit(f"no tokenizer in {model_dir}: the workload needs the API's token ids")
    texts = synthetic_texts(tok, n, lo, hi, seed=11)
    t0 = time.perf_counter()
    inputs = []
    for t in texts:
        spec.validate_input(t)
        inputs.append(spec.message_input(t))
    api_s = time.perf_counter() - t0
    assert all(is_tokenized(x) for x in inputs)
    lens = [len(x["ids"]) for x in inputs]
    return {
        "inputs": inputs,
        "mean_tokens": statistics.mean(lens),
        "api_tokenize_items_per_s_one_core": n / api_s,
    }


def worker_env(args: argparse.Namespace) -> dict[str, str]:
    return {
        "GRISTMILL_EMBED_MAX_BATCH": str(args.max_batch),
        "GRISTMILL_EMBED_MAX_TOKENS": str(args.max_tokens),
        "GRISTMILL_EMBED_MODEL_DIR": args.model_dir,
        "GRISTMILL_WORKER_STATS": "1",
    }


def run_workers(
    args: argparse.Namespace,
    inputs: list[Any],
    n_workers: int,
    depth: int,
    barrier: Any = None,
    shared_socket: str | None = None,
) -> dict[str, Any]:
    """One scheduler's dispatch path with ``n_workers`` workers of its own, or, with
    ``shared_socket``, joined by the one worker per GPU that serves several schedulers
    (decision 0014; the caller starts that worker)."""
    from core.config import Settings
    from core.messages import RequestMessage
    from core.protocol import WorkResult
    from core.vocab import PRIORITY_CLASSES, ModelRef
    from scheduler.core.batcher import Batch, BatchKey, Pending
    from scheduler.core.dispatch import DispatchCore
    from scheduler.core.plans import InFlight, Worker, Write
    from scheduler.runtime.persister import Persister
    from scheduler.runtime.worker_threads import WorkerThreads
    from scheduler.runtime.workerpool import WorkerHandle, WorkerPool

    records: list[dict[str, Any]] = []
    takes: list[float] = []
    rows_ms: list[float] = []
    ready = threading.Event()

    # The scheduler's own dispatch path (scheduler/runtime/service.py wires the same parts):
    # the core under one lock, a dispatcher and a receiver thread per worker, the
    # persister's pool building every batch's rows; only the database write is left out.
    settings = Settings(
        max_linger_ms=int(args.linger_ms), deadline_margin_ms=20, batch_timeout_s=120
    )
    core = DispatchCore.from_settings(settings, max_in_flight=depth)
    cond = threading.Condition()
    stopping = threading.Event()

    def done(offsets: list[tuple[tuple[str, int], int]], n: int) -> None:
        with cond:
            core.done(offsets, n)

    class NoLetters:
        def send(self, letters: list[Any]) -> bool:
            return True

    persister = Persister(lambda rows, brow: None, NoLetters(), done, stopping)
    write = persister.write

    def timed_write(w: Write) -> None:
        t0 = time.perf_counter()
        write(w)
        rows_ms.append((time.perf_counter() - t0) * 1e3)

    persister.write = timed_write  # type: ignore[method-assign]
    threads = WorkerThreads(core, cond, persister.submit, batch_timeout_s=120)
    take = core.batcher.take

    def timed_take(now: float, serves: Any, sizing: Any = None) -> Batch | None:
        t0 = time.perf_counter()
        b = take(now, serves, sizing)
        if b is not None:
            takes.append((time.perf_counter() - t0) * 1e3)
        return b

    core.batcher.take = timed_take  # type: ignore[method-assign]
    on_result = core.on_result

    def recorded(w: Worker, entry: InFlight, result: WorkResult, now: float) -> list[Write]:
        writes = on_result(w, entry, result, now)
        batch = entry.batch
        records.append(
            {
                "worker": w.worker_id,
                "n": len(batch.items),
                "compute_ms": (result.compute_end - result.compute_start) * 1e3,
                "queue_ms": (result.compute_start - batch.formed_at) * 1e3,
                "in_flight_after": len(w.queue),
                "done": time.perf_counter(),
                **dict(result.stats or {}),
            }
        )
        return writes

    core.on_result = recorded  # type: ignore[method-assign]

    def on_ready(h: WorkerHandle) -> None:
        threads.add(h)
        if len(threads.handles) >= n_workers:
            ready.set()

    pool = WorkerPool(
        socket_path=Path(shared_socket)
        if shared_socket
        else Path(tempfile.mkdtemp(prefix="gm-bench-")) / "workers.sock",
        n_local=0 if shared_socket else n_workers,
        models=[MODEL],
        on_ready=on_ready,
        env=worker_env(args),
    )
    t_spawn = time.perf_counter()
    pool.start()
    if not ready.wait(timeout=300):
        raise SystemExit(f"only {len(threads.handles)} of {n_workers} workers became ready")
    startup_s = time.perf_counter() - t_spawn
    handles = list(threads.handles)
    info = handles[0].hello.models[0]
    max_batch = core.max_batch[ModelRef(info.name, info.version)]
    key = BatchKey(MODEL, "1", (("normalize", True),))
    rank = PRIORITY_CLASSES.index("paid")
    stop = threading.Event()
    depth_items = args.depth * max_batch * n_workers

    def feed() -> None:
        """The consumer lane's stand-in: keep the queue deep with requests as ingest sends
        them; queued through ``DispatchCore.accept`` as the service does."""
        i = 0
        owned = {("bench", 0)}
        while not stop.is_set():
            with cond:
                need = depth_items - len(core.batcher)
            now = time.time()
            fresh = []
            for _ in range(max(0, need)):
                msg = RequestMessage(
                    request_id=f"r{i}",
                    tenant_id="bench",
                    priority="paid",
                    model=MODEL,
                    version="1",
                    input=inputs[i % len(inputs)],
                    params={"normalize": True},
                    deadline=now + 3600,
                    received_at=now,
                )
                fresh.append(Pending(msg, key, rank, ("bench", 0), i, now))
                i += 1
            if fresh:
                with cond:
                    core.accept(fresh, [], owned)
                    cond.notify_all()
            time.sleep(0.001)

    if barrier is not None:  # schedulers in other processes start their windows with us
        barrier.wait(timeout=600)
    nvml = NvmlBusy()
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    time.sleep(args.warm_s)
    nvml.start()
    t_start = time.perf_counter()
    n_before, takes_before, rows_before = len(records), len(takes), len(rows_ms)
    time.sleep(args.seconds)
    t_end = time.perf_counter()
    window = [r for r in records[n_before:] if r["done"] <= t_end]
    take_window = takes[takes_before:]
    rows_window = rows_ms[rows_before:]
    persist_backlog = persister.pending()
    stop.set()
    busy_nvml = nvml.mean(t_start, t_end)
    with cond:
        core.stop_dispatching()
        cond.notify_all()
    threads.join(deadline=time.time() + 30)
    for h in handles:
        h.stop()
    persister.shutdown()
    pool.stop(timeout_s=30)

    wall_s = (window[-1]["done"] - t_start) if window else args.seconds
    items = sum(r["n"] for r in window)
    gpu_ms = sum(r.get("gpu_ms", 0.0) for r in window)

    def med(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None

    out: dict[str, Any] = {
        "config": f"1 scheduler x {n_workers} worker(s), {depth} in flight",
        "schedulers": 1,
        "workers": n_workers,
        "in_flight": depth,
        "t_start": t_start,
        "t_end": t_end,
        "startup_s": startup_s,
        "hello_max_batch": max_batch,
        "hello_profile_ms": {str(k): v for k, v in info.profile_ms.items()},
        "pipelined": core.may_queue(core.workers[0]),
        "window_s": wall_s,
        "batches": len(window),
        "items": items,
        "items_per_s": items / wall_s,
        "mean_batch": items / max(1, len(window)),
        "busy_nvml": busy_nvml,
        "persist_backlog_at_end": persist_backlog,
        "padding": (
            sum(r.get("padded_tokens", 0) for r in window)
            / max(1.0, sum(r.get("real_tokens", 0) for r in window))
            - 1
        ),
        "median_ms": {
            "take_ms": med(take_window),
            "rows_ms": med(rows_window),
            **{
                k: med([r[k] for r in window if k in r])
                for k in (
                    "compute_ms",
                    "queue_ms",
                    "gpu_ms",
                    "gpu_span_ms",
                    "plan_ms",
                    "launch_ms",
                    "wall_ms",
                )
            },
        },
        "queued_share": (
            sum(1 for r in window if r["in_flight_after"] > 0) / len(window) if window else None
        ),
    }
    out["gpu_ms"] = gpu_ms
    # What the scheduler's cost model learned online and the batch size it chose.
    ref = ModelRef(info.name, info.version)
    out["cost_known_ms"] = {str(k): v for k, v in core.cost.known(ref).items()}
    out["batch_target"] = core.cost.batch_target(ref, max_batch)
    sizes: dict[int, int] = {}
    for r in window:
        sizes[r["n"]] = sizes.get(r["n"], 0) + 1
    out["batch_sizes"] = {str(k): v for k, v in sorted(sizes.items())}
    out["marks"] = [(r["t_launch"], r["t_enqueued"], r["t_done"]) for r in window if "t_done" in r]
    if n_workers == 1 and window and not shared_socket:
        out["late_launch"] = late_launches(out.pop("marks"))
        # One process: its events are the GPU's whole work (nothing else runs on it).
        out["busy_events"] = gpu_ms / 1e3 / wall_s
        out["idle_per_batch_ms"] = (wall_s * 1e3 - gpu_ms) / len(window)
    if busy_nvml is not None and window:
        out["idle_per_batch_ms_nvml"] = (1 - busy_nvml) * wall_s * 1e3 / len(window)
    return out


def late_launches(marks: list[tuple[float, float, float]]) -> dict[str, float]:
    """For one worker's batches (launch start, enqueued, GPU done; host clock), in launch
    order: how often the next batch was still being launched when the one before it
    ended on the GPU, and the GPU time lost to that (ms per batch, median/mean)."""
    marks = sorted(marks)
    gaps = [max(0.0, nxt[1] - cur[2]) * 1e3 for cur, nxt in itertools.pairwise(marks)]
    waits = [max(0.0, nxt[0] - cur[2]) * 1e3 for cur, nxt in itertools.pairwise(marks)]
    if not gaps:
        return {}
    return {
        "share_late": sum(g > 0 for g in gaps) / len(gaps),
        "lost_ms_mean": statistics.mean(gaps),
        "lost_ms_median": statistics.median(gaps),
        # launch began only after the batch ahead had ended (nothing to overlap with)
        "share_started_after_done": sum(w > 0 for w in waits) / len(waits),
        "launch_ms_median": statistics.median((m[1] - m[0]) * 1e3 for m in marks),
    }


def _child(
    args: argparse.Namespace,
    inputs: list[Any],
    n: int,
    depth: int,
    barrier: Any,
    shared_socket: str | None = None,
) -> dict[str, Any]:
    return run_workers(args, inputs, n, depth, barrier, shared_socket)


def _start_shared_worker(args: argparse.Namespace, sockets: list[Path]) -> Any:
    """The one worker for the GPU, joining every scheduler once their sockets exist."""
    import subprocess

    deadline = time.time() + 120
    while not all((p.parent / "worker.key").exists() for p in sockets):
        if time.time() > deadline:
            raise SystemExit("the schedulers' worker sockets did not appear")
        time.sleep(0.1)
    cmd = [sys.executable, "-m", "workers", "--models", MODEL, "--worker-id", "gpu0"]
    for p in sockets:
        cmd += ["--socket", str(p)]
    env = {**os.environ, **worker_env(args)}
    env.pop("GRISTMILL_WORKER_AUTHKEY", None)  # each scheduler's key lies beside its socket
    return subprocess.Popen(cmd, env=env, cwd=str(Path(__file__).resolve().parents[2]))


def run_config(
    args: argparse.Namespace, inputs: list[Any], s: int, n: int, depth: int, shared: bool = False
) -> dict[str, Any]:
    """``s`` scheduler processes (as ``s`` schedulers of one consumer group on one host
    would be), each with ``n`` workers, measured over one common window; ``shared``: all
    of them served by one worker (decision 0014) instead."""
    if s == 1 and not shared:
        return run_workers(args, inputs, n, depth)
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    ctx = mp.get_context("spawn")
    base = Path(tempfile.mkdtemp(prefix="gm-bench-shared-"))
    sockets = [base / f"s{i}" / "workers.sock" for i in range(s)] if shared else []
    worker = None
    with ctx.Manager() as mgr, ProcessPoolExecutor(s, mp_context=ctx) as ex:
        barrier = mgr.Barrier(s + 1)
        futs = [
            ex.submit(_child, args, inputs, n, depth, barrier, str(sockets[i]) if shared else None)
            for i in range(s)
        ]
        if shared:
            worker = _start_shared_worker(args, sockets)
        barrier.wait(timeout=600)
        nvml = NvmlBusy()
        nvml.start()
        parts = [f.result() for f in futs]
    if worker is not None:
        worker.wait(60)
    t0 = max(p["t_start"] for p in parts)
    t1 = min(p["t_end"] for p in parts)
    busy = nvml.mean(t0, t1)
    batches_per_s = sum(p["batches"] / p["window_s"] for p in parts)
    workers = 1 if shared else s * n
    out: dict[str, Any] = {
        "config": f"{s} schedulers x {n} worker(s), {depth} in flight"
        if not shared
        else f"{s} schedulers sharing 1 worker, {depth} in flight each",
        "schedulers": s,
        "workers": workers,
        "shared_worker": shared,
        "in_flight": depth,
        "items_per_s": sum(p["items_per_s"] for p in parts),
        "busy_nvml": busy,
        "mean_batch": statistics.mean(p["mean_batch"] for p in parts),
        "padding": statistics.mean(p["padding"] for p in parts),
        "parts": parts,
    }
    if busy is not None:
        out["idle_per_batch_ms_nvml"] = (1 - busy) * 1e3 / batches_per_s
    if shared:
        out["late_launch"] = late_launches([m for p in parts for m in p.pop("marks")])
        # One process on the GPU: its events (over all schedulers) are the GPU's work.
        wall = statistics.mean(p["window_s"] for p in parts)
        gpu_s = sum(p["gpu_ms"] for p in parts) / 1e3
        out["busy_events"] = gpu_s / wall
        out["idle_per_batch_ms"] = (wall - gpu_s) * 1e3 / sum(p["batches"] for p in parts)
    return out


def main() -> None:
    from core.config import Settings

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", default=Settings().embed_model_dir)
    ap.add_argument("--out", default="worker_path.json")
    ap.add_argument("--max-batch", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument(
        "--configs",
        default="1x1:1,1x1,1x2,2x1",
        help="SxW[:D]: S scheduler processes with W workers each, all on the one GPU, at "
        "most D batches in flight per worker (default 2: the scheduler's own rule); Sx1s: "
        "S scheduler processes sharing one worker (decision 0014)",
    )
    ap.add_argument("--seconds", type=float, default=15.0, help="measured window per count")
    ap.add_argument("--warm-s", type=float, default=3.0)
    ap.add_argument("--depth", type=int, default=3, help="queued batches per worker, at least")
    ap.add_argument("--linger-ms", type=float, default=5.0)
    ap.add_argument("--texts", type=int, default=8192)
    ap.add_argument("--lo", type=int, default=8)
    ap.add_argument("--hi", type=int, default=128)
    ap.add_argument("--plot", default="", help="draw charts from this JSON instead")
    ap.add_argument("--plot-out", default="docs/bench")
    args = ap.parse_args()
    if args.plot:
        plot(json.loads(Path(args.plot).read_text()), Path(args.plot_out))
        return
    if not args.model_dir:
        from core.models.text_tokenizer import model_files_dir

        args.model_dir = str(model_files_dir())
    res: dict[str, Any] = {"env": gpu_env(), "args": vars(args)}
    out = Path(args.out)

    def save() -> None:
        out.write_text(json.dumps(res, indent=1))

    w = make_workload(args.model_dir, args.texts, args.lo, args.hi, args.max_tokens)
    res["workload"] = {
        "texts": args.texts,
        "tokens": [args.lo, args.hi],
        "mean_tokens": w["mean_tokens"],
        "api_tokenize_items_per_s_one_core": w["api_tokenize_items_per_s_one_core"],
    }
    seq = round(w["mean_tokens"])
    res["ceiling"] = ceiling(args.model_dir, args.max_batch, seq)
    print(f"ceiling {res['ceiling']}", flush=True)
    save()
    res["runs"] = []
    for cfg in [c for c in args.configs.split(",") if c]:
        sw, _, d = cfg.partition(":")
        shared = sw.endswith("s")
        s, _, n = sw.removesuffix("s").partition("x")
        r = run_config(args, w["inputs"], int(s), int(n), int(d or 2), shared)
        r["pct_of_ceiling"] = r["items_per_s"] / res["ceiling"]["items_per_s"]
        res["runs"].append(r)
        print(json.dumps(r, indent=1), flush=True)
        save()
    print(
        f"\n{res['env']['gpu']}: ceiling {res['ceiling']['items_per_s']:.0f} items/s "
        f"(batch {args.max_batch} x {seq} tokens, {res['ceiling']['ms']:.2f} ms)"
    )
    for r in res["runs"]:
        print(
            f"{r['config']}: {r['items_per_s']:.0f} items/s = "
            f"{100 * r['pct_of_ceiling']:.1f}% of ceiling; busy events "
            f"{r.get('busy_events')} nvml {r['busy_nvml']}; idle/batch "
            f"{r.get('idle_per_batch_ms')} ms (nvml {r.get('idle_per_batch_ms_nvml')}); "
            f"padding {r['padding']:.2f}; mean batch {r['mean_batch']:.0f}; "
            f"late launches {r.get('late_launch')}"
        )


def plot(res: dict[str, Any], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ceil = res["ceiling"]["items_per_s"]
    runs = res["runs"]

    def name(r: dict[str, Any]) -> str:
        if r.get("shared_worker"):
            return f"{r['schedulers']}x1s:{r['in_flight']}"
        return f"{r['schedulers']}x{r['workers'] // r['schedulers']}" + (
            f":{r['in_flight']}" if "in_flight" in r else ""
        )

    labels = ["ceiling"] + [name(r) for r in runs]
    vals = [ceil] + [r["items_per_s"] for r in runs]
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    bars = ax[0].bar(labels, [v / 1e3 for v in vals], color=["#888"] + ["#3a7"] * len(runs))
    for b, v in zip(bars, vals, strict=True):
        ax[0].text(
            b.get_x() + b.get_width() / 2,
            v / 1e3,
            f"{v / 1e3:.1f}k\n{100 * v / ceil:.0f}%",
            ha="center",
            va="bottom",
        )
    ax[0].axhline(0.7 * ceil / 1e3, ls="--", color="r", lw=1, label="70% target")
    ax[0].set_ylabel("items/s (thousands)")
    ax[0].set_xlabel("raw ceiling, then schedulers x workers each : batches in flight")
    ax[0].set_title(f"{res['env']['gpu']}: mixed {res['workload']['tokens']} tokens")
    ax[0].legend(loc="lower right")
    busy = [r.get("busy_events") or r.get("busy_nvml") or 0 for r in runs]
    names = [name(r) for r in runs]
    ax[1].bar(names, [100 * b for b in busy], color="#37a")
    ax[1].set_xlabel("schedulers x workers each : batches in flight")
    ax[1].axhline(90, ls="--", color="r", lw=1, label="90% target")
    ax[1].set_ylim(0, 105)
    ax[1].set_ylabel("GPU busy while work is queued (%)")
    ax[1].legend(loc="lower right")
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_dir / "gpu_worker_path.png", dpi=110)
    print(f"wrote {out_dir / 'gpu_worker_path.png'}")


if __name__ == "__main__":
    main()
