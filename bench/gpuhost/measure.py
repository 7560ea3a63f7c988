"""What the whole-system run measures of the host: CPU by process kind, GPU busy from
NVML, what PostgreSQL's backends wait on, and py-spy samples of a busy process."""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

from gristmill.devservices import PostgresServer


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
    sampled every 100 ms, the mean over the GPUs in use (``CUDA_VISIBLE_DEVICES``, which
    NVML itself does not read, when set)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._nvml: Any = None
        with contextlib.suppress(Exception):
            import pynvml

            pynvml.nvmlInit()
            from gristmill.cli.host import host_gpus

            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(int(i)) for i in host_gpus()]
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


class PgWaits:
    """What PostgreSQL's client backends are doing, sampled every 50 ms while it runs:
    each active backend counts once a sample under its wait event (``Lock:object``,
    ``LWLock:WALWrite``, ``IO:WALSync``...) or ``cpu`` when it waits on nothing. Shares
    of all samples: where commits queue when the store is the limit.

    Beside them, the way answers travel (LISTEN/NOTIFY): every second the notification
    queue's backlog (``pg_notification_queue_usage``: what the slowest listener has yet
    to read), and the Notify SLRU's page counters over the run (``pg_stat_slru``: pages
    read back from its files because a listener fell behind its few buffers)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.counts: Counter[str] = Counter()
        self.samples = 0
        self.queue_mb: list[float] = []
        self.slru: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="pg-waits")

    def __enter__(self) -> PgWaits:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    _SLRU = (
        "SELECT blks_zeroed, blks_hit, blks_read, blks_written FROM pg_stat_slru "
        "WHERE name = 'Notify'"
    )

    def _loop(self) -> None:
        import psycopg

        with contextlib.suppress(Exception), psycopg.connect(self.dsn, autocommit=True) as pg:
            before = pg.execute(self._SLRU).fetchone()
            tick = 0
            while not self._stop.wait(0.05):
                rows = pg.execute(
                    "SELECT wait_event_type, wait_event FROM pg_stat_activity "
                    "WHERE backend_type = 'client backend' AND state = 'active' "
                    "AND pid <> pg_backend_pid()"
                ).fetchall()
                self.samples += 1
                for etype, event in rows:
                    self.counts[f"{etype}:{event}" if etype else "cpu"] += 1
                tick += 1
                if tick % 20 == 0:
                    got = pg.execute("SELECT pg_notification_queue_usage()").fetchone()
                    # The queue's cap is 8 GiB (PostgreSQL 15's QUEUE_MAX_PAGE pages).
                    self.queue_mb.append(float(got[0]) * 8192 if got else 0.0)
            after = pg.execute(self._SLRU).fetchone()
            if before and after:
                names = ("zeroed", "hit", "read", "written")
                self.slru = {
                    n: int(b) - int(a) for n, a, b in zip(names, before, after, strict=True)
                }

    def summary(self, top: int = 8) -> dict[str, Any]:
        """Mean active backends a sample, and the commonest states' mean backends; the
        notification queue's backlog (MiB, mean and worst second) and the Notify SLRU's
        pages over the run (``zeroed``: pages written to, one per 8 KiB of payloads)."""
        n = max(1, self.samples)
        q = self.queue_mb
        return {
            "active_mean": round(sum(self.counts.values()) / n, 2),
            "by_state": {k: round(v / n, 2) for k, v in self.counts.most_common(top)},
            "notify_queue_mb": {
                "mean": round(sum(q) / len(q), 2) if q else None,
                "max": round(max(q), 2) if q else None,
                "by_s": [round(x, 2) for x in q],
            },
            "notify_slru_pages": self.slru,
        }


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

    def busiest(self, kind: str) -> int:
        return busiest(self.pids(kind))

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


def busiest(pids: list[int], over_s: float = 1.0) -> int:
    """The pid that used the most CPU over ``over_s``."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            p = psutil.Process(pid)
            p.cpu_percent(None)
            procs.append(p)
    time.sleep(over_s)
    best, most = pids[0], -1.0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            use = p.cpu_percent(None)
            if use > most:
                best, most = p.pid, use
    return best


def _top(counts: dict[str, int], total: int, n: int = 25) -> list[tuple[str, float]]:
    ranked = sorted(counts.items(), key=lambda x: -x[1])[:n]
    return [(f, round(c / total, 3)) for f, c in ranked]


# py-spy's flags for each way of sampling (``profile``'s ``mode``).
SPY_MODES = {
    "cpu": [],  # the threads on a CPU: where a saturated process spends its cores
    "gil": ["--gil"],  # the thread holding the interpreter lock: what a lock-bound one does
    "threads": ["--idle", "--threads"],  # every thread, waiting too: a serial path's waits
}


def _frame(f: str) -> str:
    return f.split(" (")[0] + " " + f.rsplit("/", 1)[-1]


def thread_group(name: str) -> str:
    """A thread's name without its number (``read-3`` -> ``read``): one row per role."""
    head, sep, tail = name.rpartition("-")
    return head if sep and tail.isdigit() else name


def summarize_spy(lines: Iterable[str], by_thread: bool = False) -> dict[str, Any]:
    """py-spy ``raw`` lines (a stack, then its count) as the frames holding the most
    samples (own, and with what they call). ``by_thread`` (lines recorded with
    ``--threads``): the same per thread role, each with its share of all samples."""
    groups: dict[str, tuple[dict[str, int], dict[str, int], list[int]]] = {}
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        parts = stack.split(";")
        key = ""
        if by_thread and parts and parts[0].startswith("thread ("):
            key = thread_group(parts[0].partition(": ")[2] or parts[0])
            parts = parts[1:]
        if not parts:
            continue
        own, inclusive, total = groups.setdefault(key, ({}, {}, [0]))
        frames = [_frame(f) for f in parts]
        total[0] += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for f in set(frames):
            inclusive[f] = inclusive.get(f, 0) + n
    everything = sum(t[0] for _, _, t in groups.values())
    if not everything:
        return {}

    def one(own: dict[str, int], inclusive: dict[str, int], total: int) -> dict[str, Any]:
        return {"samples": total, "own": _top(own, total), "inclusive": _top(inclusive, total)}

    if not by_thread:
        return one(*groups[""][:2], everything)
    return {
        "samples": everything,
        "threads": {
            k: {"share": round(t[0] / everything, 3), **one(o, i, t[0])}
            for k, (o, i, t) in sorted(groups.items(), key=lambda kv: -kv[1][2][0])
        },
    }


def profile(pids: dict[str, int], seconds: float, mode: str = "cpu") -> dict[str, Any]:
    """py-spy samples of one process of each kind, summarized by ``summarize_spy``;
    ``mode`` picks what is sampled (``SPY_MODES``)."""
    spy = shutil.which("py-spy")
    if spy is None:
        return {"error": "py-spy not found"}
    procs = {}
    for kind, pid in pids.items():
        raw = Path(tempfile.mkstemp(prefix=f"spy-{kind}-", suffix=".txt")[1])
        procs[kind] = (
            subprocess.Popen(
                [spy, "record", "--pid", str(pid), "--duration", str(int(seconds)),
                 "--rate", "200", "--format", "raw", "--nonblocking", "--output", str(raw),
                 *SPY_MODES[mode]],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ),
            raw,
        )  # fmt: skip
    out: dict[str, Any] = {}
    for kind, (proc, raw) in procs.items():
        proc.wait(seconds + 30)
        got = summarize_spy(raw.read_text(errors="replace").splitlines(), mode == "threads")
        if got:
            out[kind] = got
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


def tokenizer_costs(texts: dict[str, list[str]], model_dir: str) -> dict[str, Any]:
    """µs a text on one core: the model's tokenizer one text at a time (what the API ran
    before), its batch call on every core (what a worker runs), and the fast WordPiece
    path (core/models/wordpiece.py) warm; each set timed twice, interleaved."""
    from core.models.text_tokenizer import load_tokenizer
    from core.models.wordpiece import FastWordPiece

    tok = load_tokenizer(Path(model_dir), 256)
    fast = FastWordPiece.from_tokenizer(tok, 256)
    assert fast is not None
    out: dict[str, Any] = {}
    for name, xs in texts.items():
        assert [fast.encode(x) for x in xs[:2000]] == [list(tok.encode(x).ids) for x in xs[:2000]]
        runs: dict[str, list[float]] = {"tokenizer_one": [], "fast_one": [], "tokenizer_batch": []}
        for _ in range(2):
            t = time.perf_counter()
            for x in xs:
                tok.encode(x)
            runs["tokenizer_one"].append(time.perf_counter() - t)
            t = time.perf_counter()
            for x in xs:
                fast.encode(x)
            runs["fast_one"].append(time.perf_counter() - t)
            t = time.perf_counter()
            tok.encode_batch_fast(xs)
            runs["tokenizer_batch"].append(time.perf_counter() - t)
        out[name] = {
            k: {
                "us_per_text": round(min(v) / len(xs) * 1e6, 2),
                "texts_per_s": round(len(xs) / min(v)),
            }
            for k, v in runs.items()
        }
        out[name]["texts"] = len(xs)
    return out


# A sync request's stages in the request log, as bench/stages.py names them, and the
# whole of its way through the service (accepted until its row was committed).
SYNC_SPANS = {
    "queue": "r.consumed_at - r.received_at",
    "batch_wait": "r.batched_at - r.consumed_at",
    "dispatch": "r.compute_start_at - r.batched_at",
    "compute": "r.compute_end_at - r.compute_start_at",
    "persist": "r.persisted_at - r.compute_end_at",
    "server": "r.persisted_at - r.received_at",
}
# ``dispatch`` in three (the batch's row, migration 0030): to the worker (the
# scheduler's wait for a slot, the pipe), the worker's queue (batches ahead of it, the
# launching thread busy), the device's (the batches launched before it still running).
DISPATCH_PARTS = {
    "to_worker": "b.worker_received_at - r.batched_at",
    "worker_queue": "b.launched_at - b.worker_received_at",
    "device_queue": "r.compute_start_at - b.launched_at",
}


def sync_stages_by_second(conn: Any, t0: float, t1: float) -> list[dict[str, Any]]:
    """Per second of a sync load (by when the API received each request): how many
    requests the log holds, how many have their row committed, and each stage's p50 and
    p99 (ms). A second where answers came late shows which stage took the time: the
    trip through Kafka (``queue``), the batcher, the worker (``dispatch``, and its
    parts: ``DISPATCH_PARTS``), or the commit."""
    all_spans = {**SYNC_SPANS, **DISPATCH_PARTS}
    cols = ", ".join(
        f"percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP "
        f"(ORDER BY extract(epoch FROM {span}) * 1000) FILTER (WHERE {span} IS NOT NULL)"
        for span in all_spans.values()
    )
    rows = conn.execute(
        "SELECT floor(extract(epoch FROM r.received_at) - %s)::int AS s, count(*), "
        f"count(r.persisted_at), {cols} FROM requests r "
        "LEFT JOIN batches b ON b.batch_id = r.batch_id WHERE r.job_id IS NULL "
        "AND r.received_at >= to_timestamp(%s) AND r.received_at < to_timestamp(%s) "
        "GROUP BY 1 ORDER BY 1",
        (t0, t0, t1),
    ).fetchall()
    out = []
    for s, n, persisted, *spans in rows:
        entry: dict[str, Any] = {"s": s, "requests": n, "persisted": persisted}
        for name, pcts in zip(all_spans, spans, strict=True):
            entry[name] = [round(float(x), 1) for x in pcts] if pcts else None
        out.append(entry)
    return out
