"""The real embedding model end to end on this machine's CPU (issue 19 item 5).

A fresh Kafka and PostgreSQL (fsync on), one API (``--api-processes`` uvicorn
processes) and a scheduler with ``--workers`` all-minilm-l6-v2 workers on the CPU. Two
runs, each with every process's CPU measured:

1. a job of ``--items`` sentences submitted over HTTP (one JSON body): items/s from
   submission to the last row, and while its items flow;
2. sync requests, open loop at ``--rate`` requests/s for ``--seconds``: latency and
   answers/s.

Where the time goes: CPU seconds per process group per item; the workers' busy share
(sum of batch compute over the wall time, from ``batches``); the stage percentiles of
the request log (``stage_breakdown``, docs/analysts.md).

    flock /tmp/gristmill-heavy.lock .venv/bin/python -m bench.store.e2e_real \\
        --items 20000 --rate 100 --out docs/bench/store
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench.openloop import run_open_loop
from bench.peers.procs import cpu_seconds
from bench.store.persist import Stack, kafka_pids, machine
from gristmill.devservices import free_port
from gristmill.devservices.procs import children
from gristmill.devservices.stack import REPO, api_command, scheduler_command
from results.db import libpq_url, make_engine
from results.tenants import create_tenant, issue_key, set_plan

MODEL = "all-minilm-l6-v2"
STAGES = ("queue", "batch_wait", "dispatch", "compute", "persist", "total")
WORDS = (  # noqa: SIM905 (one sentence reads better than a list of words)
    "the service answers every request with a vector that places similar sentences near "
    "each other so that search ranking clustering and deduplication can work on meaning"
).split()


def sentence(i: int) -> str:
    """A sentence of 10 to 25 words, different for every i."""
    n = 10 + i % 16
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n)) + f" #{i}"


class System:
    def __init__(self, args: argparse.Namespace, workdir: Path):
        self.stack = Stack(workdir, durable=True, extra_env={})
        self.args = args
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        self.stack.start()
        env = self.stack.env
        with make_engine(self.stack.settings.database_url).begin() as conn:
            t = create_tenant(conn, "bench", "enterprise")
            set_plan(conn, t.name, rate_rps=1e6, burst=1e6, job_items_per_s=1e9)
            self.key = issue_key(conn, t)[1]
        run_dir = Path(tempfile.mkdtemp(prefix="gm-e2e-"))
        self.procs["scheduler"] = self._spawn(
            "scheduler", scheduler_command(self.args.workers, MODEL, run_dir), env
        )
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.procs["api"] = self._spawn("api", api_command(port, self.args.api_processes), env)
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                r = httpx.post(
                    f"{self.url}/v1/infer",
                    headers=self.headers,
                    json={"model": MODEL, "input": "warm up"},
                    timeout=30,
                )
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise RuntimeError("the embedding model was not served in time")

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("ab")
        return subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
        )

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    @property
    def dsn(self) -> str:
        return libpq_url(self.stack.settings.database_url)

    def cpu(self) -> dict[str, float]:
        sched = self.procs["scheduler"].pid
        pg = self.stack.pg.pid
        return {
            "api": cpu_seconds(self.procs["api"].pid),
            "scheduler": cpu_seconds(sched, recursive=False),
            "workers": sum(cpu_seconds(w) for w in children(sched)),
            "kafka": sum(cpu_seconds(p) for p in kafka_pids(self.stack)),
            "postgres": cpu_seconds(pg) if pg else 0.0,
            "load_generator": cpu_seconds(os.getpid(), recursive=False),
        }

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, 15)
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, 9)
        self.stack.stop()


def where_time_goes(sys_: System, t0: datetime, t1: datetime) -> dict[str, Any]:
    with psycopg.connect(sys_.dsn) as conn:
        picked = ", ".join(f"{s}_{p}_ms" for s in STAGES for p in ("p50", "p95"))
        stages = conn.execute(
            f"SELECT tier, requests, {picked} FROM stage_breakdown(%s, %s)", (t0, t1)
        ).fetchall()
        busy, batches, mean = conn.execute(
            "SELECT coalesce(sum(compute_ms), 0) / 1000, count(*), avg(size) FROM batches "
            "WHERE formed_at >= %s AND formed_at < %s",
            (t0, t1),
        ).fetchone()  # type: ignore[misc]
    cols = [
        "tier",
        "requests",
        *(f"{stage}_{p}" for stage in STAGES for p in ("p50", "p95")),
    ]
    wall = (t1 - t0).total_seconds()
    return {
        "stages_ms": [
            dict(zip(cols, [r[0], r[1], *(round(float(x or 0), 1) for x in r[2:])], strict=True))
            for r in stages
        ],
        "batches": batches,
        "mean_batch": round(float(mean or 0), 1),
        "workers_busy": round(float(busy) / wall / sys_.args.workers, 3),
    }


def per_item(cpu0: dict[str, float], cpu1: dict[str, float], items: int, wall: float) -> Any:
    return {
        "cpu_cores": {k: round((cpu1[k] - cpu0[k]) / wall, 2) for k in cpu0},
        "cpu_ms_per_item": {k: round((cpu1[k] - cpu0[k]) / items * 1e3, 3) for k in cpu0},
    }


def job_run(sys_: System, items: int) -> dict[str, Any]:
    body = {"model": MODEL, "items": [{"input": sentence(i)} for i in range(items)]}
    cpu0 = sys_.cpu()
    t0 = datetime.now(UTC)
    r = httpx.post(f"{sys_.url}/v1/jobs", headers=sys_.headers, json=body, timeout=600)
    r.raise_for_status()
    accepted_s = (datetime.now(UTC) - t0).total_seconds()
    job_id = r.json()["job_id"]
    with psycopg.connect(sys_.dsn, autocommit=True) as conn:
        while True:
            fin = conn.execute(
                "SELECT finished_at FROM jobs WHERE job_id = %s", (job_id,)
            ).fetchone()
            if fin and fin[0]:
                break
            time.sleep(1)
        first, last, n = conn.execute(
            "SELECT min(consumed_at), max(persisted_at), count(*) FROM requests "
            "WHERE job_id = %s AND status = 'succeeded'",
            (job_id,),
        ).fetchone()  # type: ignore[misc]
    t1 = datetime.now(UTC)
    cpu1 = sys_.cpu()
    wall = (t1 - t0).total_seconds()
    flowing = (last - first).total_seconds()
    return {
        "items": items,
        "succeeded": n,
        "accept_s": round(accepted_s, 2),
        "end_to_end_s": round(wall, 1),
        "items_per_s_end_to_end": round(items / wall, 1),
        "items_per_s_flowing": round(n / flowing, 1),
        **per_item(cpu0, cpu1, items, wall),
        **where_time_goes(sys_, t0, t1),
    }


def sync_run(sys_: System, rate: float, seconds: float) -> dict[str, Any]:
    n = int(rate * seconds)
    cpu0 = sys_.cpu()
    t0 = datetime.now(UTC)
    res = asyncio.run(
        run_open_loop(
            url=f"{sys_.url}/v1/infer",
            headers=sys_.headers,
            rate=rate,
            count=n,
            make_body=lambda i: {"model": MODEL, "input": sentence(10_000_000 + i)},
        )
    )
    time.sleep(1)
    t1 = datetime.now(UTC)
    cpu1 = sys_.cpu()
    wall = (t1 - t0).total_seconds()
    return {
        "rate": rate,
        **res.outcomes(),
        "answers_per_s": round(len(res.ok) / wall, 1),
        **per_item(cpu0, cpu1, max(1, len(res.ok)), wall),
        **where_time_goes(sys_, t0, t1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=20_000)
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--api-processes", type=int, default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="gm-e2e-real-"))
    sys_ = System(args, workdir)
    out: dict[str, Any] = {"args": vars(args) | {"out": str(args.out)}, "machine": machine()}
    try:
        sys_.start()
        out["job"] = job_run(sys_, args.items)
        print(json.dumps(out["job"], indent=2), flush=True)
        out["sync"] = sync_run(sys_, args.rate, args.seconds)
        print(json.dumps(out["sync"], indent=2), flush=True)
    finally:
        sys_.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "e2e_real.json").write_text(json.dumps(out, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
