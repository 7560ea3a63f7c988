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

    python3 -m bench.gpuhost.run --out $OUT --scenarios sync,job
    # then, here: .venv/bin/python -m bench.gpuhost.plot gpuhost.json --out docs/bench/gpuhost
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench import corpus
from bench.openloop import LoadSpec, run_load
from core.config import settings_from_env
from core.topics import ensure_topics
from gristmill.devservices import KafkaCluster, PostgresServer, free_port
from gristmill.hostshape import partitions_for, shape_host
from gristmill.migrate import migrate_database
from results.db import libpq_url, make_engine
from results.tenants import create_tenant, issue_key, set_plan

REPO = Path(__file__).resolve().parents[2]
HOST_ROOT = Path(os.environ.get("GMHOST_ROOT", "/opt/gmhost"))
MODEL = "all-minilm-l6-v2"
MAX_BATCH = 1024  # the GPU benchmarks' batch: the cost curve's best items/s on a GPU
JOB_SAMPLE = 2000  # job answers checked against the model's own vectors
ROUTES = {"infer": "/v1/infer", "embeddings": "/v1/embeddings"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- the host ----------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"cores": len(os.sched_getaffinity(0))}
    with contextlib.suppress(Exception):
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        info["gpus"] = [line.strip() for line in out.splitlines() if line.strip()]
    info["python"] = sys.version.split()[0]
    with contextlib.suppress(Exception):
        import torch

        info["torch"] = torch.__version__
    return info


class GpuBusy:
    """NVML's utilization.gpu (share of each sample period with a kernel running),
    sampled every 100 ms over every GPU."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._nvml: Any = None
        with contextlib.suppress(Exception):
            import pynvml

            pynvml.nvmlInit()
            n = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
            self._nvml = pynvml
        if self._nvml is not None:
            threading.Thread(target=self._loop, daemon=True, name="nvml").start()

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            us = [self._nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self._handles]
            self.samples.append((time.time(), statistics.mean(us) / 100))

    def mean(self, t0: float, t1: float) -> float | None:
        xs = [u for t, u in self.samples if t0 + 0.5 <= t <= t1]
        return round(statistics.mean(xs), 3) if xs else None

    def series(self, t0: float, t1: float) -> list[tuple[float, float]]:
        return [(round(t - t0, 2), u) for t, u in self.samples if t0 <= t <= t1]


class Cpu:
    """CPU seconds by process kind: the host's children by role, Kafka, PostgreSQL and
    the load generator (this process and its pool)."""

    def __init__(self, host_pid: int, kafka_pids: list[int], pg: PostgresServer) -> None:
        self.host_pid = host_pid
        self.kafka_pids = kafka_pids
        self.pg = pg

    @staticmethod
    def _tree(pid: int) -> list[psutil.Process]:
        try:
            p = psutil.Process(pid)
            return [p, *p.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    @staticmethod
    def _seconds(procs: list[psutil.Process]) -> float:
        total = 0.0
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
        return total

    def kind(self, p: psutil.Process) -> str:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            cmd = " ".join(p.cmdline())
            for k in ("api", "scheduler", "worker"):
                if f"gristmill {k}" in cmd:
                    return k
        return "host"

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        try:
            host = psutil.Process(self.host_pid)
            top = host.children()
        except psutil.NoSuchProcess:
            top = []
        for child in top:
            k = self.kind(child)
            out[k] = out.get(k, 0.0) + self._seconds(self._tree(child.pid))
        out["kafka"] = sum(self._seconds(self._tree(p)) for p in self.kafka_pids)
        pg_pid = self.pg.pid
        out["postgres"] = self._seconds(self._tree(pg_pid)) if pg_pid else 0.0
        # This process and its load-generating children; the services it started are
        # its children too, and counted above.
        counted = {p.pid for c in top for p in self._tree(c.pid)}
        counted |= {p.pid for k in self.kafka_pids for p in self._tree(k)}
        counted |= {p.pid for p in self._tree(pg_pid)} if pg_pid else set()
        counted.add(self.host_pid)
        me = self._tree(os.getpid())
        out["load_generator"] = self._seconds([p for p in me if p.pid not in counted])
        out["t"] = time.time()
        return out

    def pids(self, kind: str) -> list[int]:
        """Live processes of one kind (API processes are the uvicorn children)."""
        try:
            top = psutil.Process(self.host_pid).children()
        except psutil.NoSuchProcess:
            return []
        found = []
        for child in top:
            if self.kind(child) == kind:
                kids = self._tree(child.pid)
                found += [p.pid for p in (kids[1:] if kind == "api" and len(kids) > 1 else kids)]
        return found


def _top(counts: dict[str, int], total: int, n: int = 25) -> list[tuple[str, float]]:
    ranked = sorted(counts.items(), key=lambda x: -x[1])[:n]
    return [(f, round(c / total, 3)) for f, c in ranked]


def profile(pids: dict[str, int], seconds: float) -> dict[str, Any]:
    """py-spy samples of one process of each kind: the functions holding the most
    samples (own time, and with what they call), so a saturated process shows where its
    CPU goes."""
    spy = shutil.which("py-spy")
    if spy is None:
        return {"error": "py-spy not found"}
    procs = {}
    for kind, pid in pids.items():
        raw = Path(tempfile.mkstemp(prefix=f"spy-{kind}-", suffix=".txt")[1])
        procs[kind] = (
            subprocess.Popen(
                [spy, "record", "--pid", str(pid), "--duration", str(int(seconds)),
                 "--rate", "200", "--format", "raw", "--nonblocking", "--output", str(raw)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ),
            raw,
        )  # fmt: skip
    out: dict[str, Any] = {}
    for kind, (proc, raw) in procs.items():
        proc.wait(seconds + 30)
        own: dict[str, int] = {}
        inclusive: dict[str, int] = {}
        total = 0
        for line in raw.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not count.isdigit():
                continue
            n = int(count)
            frames = [f.split(" (")[0] + " " + f.rsplit("/", 1)[-1] for f in stack.split(";")]
            total += n
            own[frames[-1]] = own.get(frames[-1], 0) + n
            for f in set(frames):
                inclusive[f] = inclusive.get(f, 0) + n

        if total:
            out[kind] = {
                "samples": total,
                "own": _top(own, total),
                "inclusive": _top(inclusive, total),
            }
        raw.unlink(missing_ok=True)
    return out


def cpu_delta(a: dict[str, float], b: dict[str, float], requests: int) -> dict[str, Any]:
    wall = b["t"] - a["t"]
    kinds = [k for k in b if k != "t"]
    return {
        "cores": {k: round((b[k] - a.get(k, 0.0)) / wall, 2) for k in kinds},
        "ms_per_request": {
            k: round((b[k] - a.get(k, 0.0)) / max(1, requests) * 1e3, 4) for k in kinds
        },
    }


# ---- corpora and the raw ceiling ---------------------------------------------------------
def build_corpora(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Short sentences for sync traffic (with the model's vectors), the job's texts (with
    vectors for a sample), and the raw ceiling for the job's lengths: all computed here
    by the model itself on the GPU before any service starts."""
    import numpy as np
    import torch

    from core.config import load_settings
    from core.vocab import ModelRef
    from workers.models.loader import load_models

    settings = load_settings()
    model_dir = Path(settings.embed_model_dir)
    words = corpus.vocabulary_words(model_dir / "vocab.txt")
    model = load_models(settings, [MODEL])[ModelRef(MODEL, "1")]
    out: dict[str, Any] = {}
    t0 = time.time()
    short = corpus.sentences(words, corpus.short_lengths(args.sync_texts, seed=1), seed=2)
    corpus.write(work / "short", short, model.embed_array(short))  # type: ignore[attr-defined]
    lengths = corpus.mixed_lengths(args.job_items, 8, 256, seed=3)
    job = corpus.sentences(words, lengths, seed=4)
    rng = random.Random(5)
    sample = sorted(rng.sample(range(len(job)), min(JOB_SAMPLE, len(job))))
    vectors = model.embed_array([job[i] for i in sample])  # type: ignore[attr-defined]
    with open(work / "job.jsonl", "wb") as f:
        f.write(b"".join(json.dumps({"input": t}).encode() + b"\n" for t in job))
    np.save(work / "job.sample.npy", np.asarray(sample, dtype=np.int64))
    np.save(work / "job.vectors.npy", vectors)
    out["corpora_s"] = round(time.time() - t0, 1)
    out["ceiling"] = raw_ceiling(model, job, rng, args.ceiling_items)
    model.close()
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def raw_ceiling(model: Any, texts: list[str], rng: random.Random, n: int) -> dict[str, Any]:
    """The encoder alone on token ids already on the GPU, batches of MAX_BATCH sorted by
    length (the least padding any batching can reach): items/s for these inputs."""
    import torch

    pick = rng.sample(texts, min(n, len(texts)))
    ids = [e.ids for e in model.tokenizer.encode_batch(pick)]
    ids.sort(key=len)
    dev = model.device
    encoder = model.encoder  # the worker's own encoder and weights
    batches = []
    for i in range(0, len(ids), MAX_BATCH):
        chunk = ids[i : i + MAX_BATCH]
        width = max(map(len, chunk))
        t = torch.zeros((len(chunk), width), dtype=torch.int32)
        for r, row in enumerate(chunk):
            t[r, : len(row)] = torch.tensor(row, dtype=torch.int32)
        lens = torch.tensor([len(r) for r in chunk], dtype=torch.int32)
        batches.append((t.to(dev), lens.to(dev)))
    cuda = dev.type == "cuda"
    with torch.inference_mode():
        for b in batches:  # every shape once first: first runs of a shape cost more
            encoder(*b)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for b in batches:
            encoder(*b)
        if cuda:
            torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3
    return {
        "items": len(ids),
        "mean_tokens": round(statistics.mean(map(len, ids)), 1),
        "batch": MAX_BATCH,
        "ms": round(ms, 1),
        "items_per_s": round(len(ids) / ms * 1e3),
    }


# ---- services and the host ---------------------------------------------------------------
class Stack:
    def __init__(self, work: Path, args: argparse.Namespace) -> None:
        self.work = work
        self.args = args
        self.kafka: KafkaCluster | None = None
        self.pg: PostgresServer | None = None
        self.host: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}
        self.keys: dict[str, str] = {}
        self.url = ""

    def start(self) -> dict[str, Any]:
        cores = len(os.sched_getaffinity(0))
        gpus = len(_visible_gpus())
        shape = shape_host(cores, gpus, colocated=True, reserve_cores=self.args.loadgen_cores)
        partitions = partitions_for(shape.schedulers, minimum=self.args.partitions)
        log(f"shape: {shape}")
        self.kafka = KafkaCluster(
            self.work / "kafka",
            n_brokers=self.args.brokers,
            partitions=partitions,
            libs_dir=HOST_ROOT / "kafka-libs",
            java=str(HOST_ROOT / "jre/bin/java"),
            extra_jvm_opts=("-Xmx2g", "-Xms1g"),
            extra_config={"num.network.threads": 4, "num.io.threads": 8},
        )
        pg_dir = Path(tempfile.mkdtemp(prefix="gmhost-pg-"))
        pg_dir.chmod(0o711)
        self.pg = PostgresServer(pg_dir, fast=False, max_connections=500)
        t0 = time.time()
        self.kafka.start(timeout_s=120)
        self.pg.start()
        log(f"Kafka ({self.args.brokers} brokers) and PostgreSQL up in {time.time() - t0:.0f} s")
        run = uuid.uuid4().hex[:6]
        self.env = {
            **os.environ,
            "KAFKA_BOOTSTRAP": self.kafka.bootstrap,
            "DATABASE_URL": self.pg.url,
            "GRISTMILL_TOPIC_PREFIX": f"gm-{run}",
            "GRISTMILL_CONSUMER_GROUP": f"gm-{run}",
            "GRISTMILL_TOPIC_PARTITIONS": str(partitions),
            "GRISTMILL_TOPIC_REPLICATION": str(min(3, self.args.brokers)),
            "GRISTMILL_EMBED_MAX_BATCH": str(MAX_BATCH),
            "GRISTMILL_WORKER_MODELS": MODEL,
            "PYTHONUNBUFFERED": "1",
        }
        if self.args.brokers < 3:  # a smoke run on one broker: below what production needs
            self.env["GRISTMILL_ALLOW_WEAK_DURABILITY"] = "true"
        settings = settings_from_env(self.env)
        migrate_database(settings)
        ensure_topics(settings)
        with make_engine(settings.database_url).begin() as conn:
            for tier in ("enterprise", "paid", "free"):
                t = create_tenant(conn, f"{tier}-{run}", tier)
                set_plan(conn, t.name, rate_rps=1e6, burst=1e6, job_items_per_s=1e9)
                self.keys[tier] = issue_key(conn, t)[1]
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        argv = [
            sys.executable, "-m", "gristmill", "host", "--models", MODEL, "--colocated",
            "--reserve-cores", str(self.args.loadgen_cores), "--port", str(port),
            "--run-dir", str(self.work / "host"),
        ]  # fmt: skip
        self.host = subprocess.Popen(
            argv,
            env=self.env,
            stdout=(self.work / "host.log").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_served()
        return {
            "shape": {
                "api_processes": shape.api_processes,
                "schedulers": shape.schedulers,
                "workers": shape.workers,
                "reasons": shape.reasons,
            },
            "partitions": partitions,
            "brokers": self.args.brokers,
            "start_s": round(time.time() - t0, 1),
        }

    def _wait_served(self, timeout_s: float = 300) -> None:
        deadline = time.time() + timeout_s
        last = ""
        while time.time() < deadline:
            assert self.host is not None
            if self.host.poll() is not None:
                raise RuntimeError(f"gristmill host exited {self.host.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.post(
                    f"{self.url}/v1/infer",
                    headers=self.headers(),
                    json={"model": MODEL, "input": "warm up"},
                    timeout=30,
                )
                if r.status_code == 200:
                    return
                last = r.text[:200]
            time.sleep(1)
        raise RuntimeError(f"{MODEL} not served in time: {last}")

    def headers(self, tier: str = "enterprise") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tier]}"}

    def cpu(self) -> Cpu:
        assert self.host is not None and self.kafka is not None and self.pg is not None
        pids = [n.proc.pid for n in self.kafka._nodes if n.proc is not None]
        return Cpu(self.host.pid, pids, self.pg)

    def stop(self) -> None:
        if self.host is not None and self.host.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.host.pid, 15)
            try:
                self.host.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.host.pid, 9)
        if self.kafka is not None:
            self.kafka.stop()
        if self.pg is not None:
            self.pg.stop()


def _visible_gpus() -> list[str]:
    from gristmill.cli.host import host_gpus

    return host_gpus()


# ---- scenarios ---------------------------------------------------------------------------
def sync_scenario(
    stack: Stack, work: Path, args: argparse.Namespace, gpu: GpuBusy
) -> list[dict[str, Any]]:
    rows = []
    cpu = stack.cpu()
    for wire in args.wires.split(","):
        for rate in [float(r) for r in args.rates.split(",")]:
            spec = LoadSpec(
                url=stack.url + ROUTES[wire],
                headers=stack.headers(),
                rate=rate,
                duration_s=args.seconds,
                tag=uuid.uuid4().hex[:6],
                model=MODEL,
                timeout_s=30.0,
                corpus=str(work / "short"),
                wire=wire,
                client="raw",
            )
            procs = max(2, min(args.loadgen_cores * 2, round(rate / 2500) + 1))
            a, t0 = cpu.sample(), time.time()
            spied: dict[str, Any] = {}
            timer: threading.Timer | None = None
            if args.profile and rate == max(float(r) for r in args.rates.split(",")):
                kinds = {k: cpu.pids(k) for k in ("api", "scheduler", "worker")}
                picks = {k: v[0] for k, v in kinds.items() if v}
                # Sampled in the middle of the run, once the rate has settled.
                timer = threading.Timer(
                    args.seconds / 3,
                    lambda got=spied, pids=picks: got.update(
                        profile(pids, min(10.0, args.seconds / 2))
                    ),
                )
                timer.start()
            res = run_load(spec, processes=procs)
            b, t1 = cpu.sample(), time.time()
            if timer is not None:
                timer.join()
            summary = res.summary()
            row = {
                "wire": wire,
                **summary,
                "cpu": cpu_delta(a, b, summary["requests"]),
                "gpu_busy": gpu.mean(t0, t1),
                "profile": spied,
            }
            rows.append(row)
            log(
                f"sync {wire} {rate:.0f}/s: {summary['statuses']} p50/p95/p99 "
                f"{summary['p50_ms']}/{summary['p95_ms']}/{summary['p99_ms']} ms, "
                f"wrong {summary['wrong_outputs']}, cores {row['cpu']['cores']}"
            )
            time.sleep(2)
    return rows


def job_scenario(
    stack: Stack,
    work: Path,
    gpu: GpuBusy,
    ceiling: dict[str, Any],
    beside: Callable[[], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    import numpy as np
    import psycopg
    from gristmill_client import Client

    path = work / "job.jsonl"
    n = sum(1 for _ in path.open("rb"))
    client = Client(stack.url, stack.keys["paid"], timeout_s=3600)
    cpu = stack.cpu()
    a, t0 = cpu.sample(), time.time()
    side: dict[str, Any] = {}
    th = None
    if beside is not None:
        th = threading.Thread(target=lambda: side.update(beside()), daemon=True)
        th.start()
    job = client.submit_job(MODEL, path)
    accepted_s = time.time() - t0
    log(f"job {job['job_id']}: {n} items accepted in {accepted_s:.1f} s")
    dsn = libpq_url(settings_from_env(stack.env).database_url)
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT finished_at FROM jobs WHERE job_id = %s", (job["job_id"],)
            ).fetchone()
            if row and row[0]:
                break
            time.sleep(0.5)
        first, last, done = conn.execute(
            "SELECT min(consumed_at), max(persisted_at), count(*) FROM requests "
            "WHERE job_id = %s AND status = 'succeeded'",
            (job["job_id"],),
        ).fetchone()  # type: ignore[misc]
        batches, mean_batch = conn.execute(
            "SELECT count(*), avg(size) FROM batches WHERE formed_at >= to_timestamp(%s)", (t0,)
        ).fetchone()  # type: ignore[misc]
    b = cpu.sample()
    if th is not None:
        th.join()
    t_last = last.timestamp()
    wall = t_last - t0
    sample = np.load(work / "job.sample.npy")
    refs = np.load(work / "job.vectors.npy")
    wrong = 0
    for k, idx in enumerate(sample.tolist()):
        items = client._request(
            "GET", f"/v1/jobs/{job['job_id']}/items", params={"cursor": idx, "limit": 1}
        ).json()["items"]
        got = items[0].get("output") if items else None
        vec = np.asarray(got if got is not None else [], dtype=np.float32)
        if vec.shape != refs[k].shape or corpus.cosine(vec, refs[k]) < corpus.MIN_COSINE:
            wrong += 1
    checked = len(sample)
    result = {
        "items": n,
        "succeeded": done,
        "accept_s": round(accepted_s, 1),
        "first_byte_to_last_row_s": round(wall, 1),
        "items_per_s": round(n / wall),
        "flowing_items_per_s": round(done / max(1e-3, t_last - first.timestamp())),
        "ceiling_items_per_s": ceiling.get("items_per_s"),
        "of_ceiling": round(n / wall / ceiling["items_per_s"], 3) if ceiling else None,
        "gpu_busy": gpu.mean(t0 + accepted_s, t_last),
        "gpu_busy_series": gpu.series(t0, t_last),
        "batches": batches,
        "mean_batch": round(float(mean_batch or 0), 1),
        "checked": checked,
        "wrong": wrong,
        "cpu": cpu_delta(a, b, n),
    }
    if side:
        result["beside"] = side
    log(f"job: {json.dumps({k: v for k, v in result.items() if k != 'gpu_busy_series'})}")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench-out")))
    ap.add_argument("--scenarios", default="sync,job")
    ap.add_argument("--rates", default="1000,2500,5000,10000")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--wires", default="infer,embeddings")
    ap.add_argument("--job-items", type=int, default=1_000_000)
    ap.add_argument("--sync-texts", type=int, default=20_000)
    ap.add_argument("--ceiling-items", type=int, default=65_536)
    ap.add_argument("--beside-rate", type=float, default=2000.0)
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--loadgen-cores", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="py-spy at the top rate")
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
    try:
        result.update(build_corpora(work, args))
        log(f"corpora and ceiling: {result['ceiling']}")
        save()
        result["system"] = stack.start()
        save()
        if "sync" in scenarios:
            result["sync"] = sync_scenario(stack, work, args, gpu)
            save()
        if "job" in scenarios:
            result["job"] = job_scenario(stack, work, gpu, result["ceiling"])
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
    return run_load(spec, processes=3).summary()


if __name__ == "__main__":
    sys.exit(main())
