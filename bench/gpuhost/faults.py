"""Faults on the GPU host while a job and sync traffic run (issue 28 item 6).

``gristmill host`` supervises its processes as an orchestrator would, so each fault is a
SIGKILL and the host's own restart: the GPU worker first (the schedulers hand its
batches back; it loads and warms the model again and dials every scheduler), then one
scheduler (its partitions move to the others within the session timeout, what it had
not committed is read again; the worker dials it again when it is back), then one API
process (uvicorn starts another).

Audit, by SQL once everything has drained:
* the job: every item has a succeeded row (one each: the request log is keyed by
  request id) and a sample of them carries the model's own vector;
* sync: every request the API accepted (200, or 504 once accepted) has a row; the
  answers the clients got were the model's vectors (checked as they came).
Recovery: rows persisted per second, by kind; for each fault, the seconds until the
sync rows' rate over 5 s is back to 80% of its median over the 10 s before; what the API
refused each second, by reason.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import psycopg

from bench.gpuhost.corpora import MODEL
from bench.gpuhost.stack import Stack, log
from bench.openloop import LoadSpec, run_load
from core.config import settings_from_env
from results.db import libpq_url

KINDS = ("worker", "scheduler", "api")


def _victim(stack: Stack, kind: str) -> int | None:
    """A live process of ``kind``: an API process is a uvicorn child, not its parent."""
    pids = stack.cpu().pids(kind)
    return pids[-1] if pids else None


def faults_scenario(stack: Stack, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from gristmill_client import Client

    client = Client(stack.url, stack.keys["paid"], timeout_s=3600)
    spec = LoadSpec(
        url=f"{stack.url}/v1/infer",
        headers=stack.headers("free"),
        rate=args.beside_rate,
        duration_s=args.fault_seconds,
        tag=uuid.uuid4().hex[:6],
        model=MODEL,
        timeout_s=30.0,
        corpus=str(work / "short"),
        client="raw",
    )
    t0 = time.time()
    sync: dict[str, Any] = {}
    job: dict[str, Any] = {}
    load = threading.Thread(target=lambda: sync.update(run_load(spec, 3).summary()))
    submit = threading.Thread(
        target=lambda: job.update(client.submit_job(MODEL, work / "job.jsonl"))
    )
    load.start()
    submit.start()
    faults: list[dict[str, Any]] = []
    offsets = [float(x) for x in args.fault_at.split(",")]
    for kind, at in zip(KINDS, offsets, strict=False):
        time.sleep(max(0.0, t0 + at - time.time()))
        pid = _victim(stack, kind)
        if pid is None:
            faults.append({"kind": kind, "at_s": at, "error": "no such process"})
            continue
        with_name = " ".join(psutil.Process(pid).cmdline()[:4])
        psutil.Process(pid).send_signal(signal.SIGKILL)
        faults.append({"kind": kind, "at_s": round(time.time() - t0, 1), "pid": pid})
        log(f"fault: SIGKILL {kind} pid {pid} ({with_name})")
    submit.join()
    load.join()
    job_id = job.get("job_id")
    dsn = libpq_url(settings_from_env(stack.env).database_url)
    with psycopg.connect(dsn, autocommit=True) as conn:
        deadline = time.time() + 600
        while job_id and time.time() < deadline:
            row = conn.execute(
                "SELECT finished_at FROM jobs WHERE job_id = %s", (job_id,)
            ).fetchone()
            if row and row[0]:
                break
            time.sleep(1)
        time.sleep(5)  # late sync rows (504s persist after their answer)
        audit = _audit(conn, stack, job_id, t0)
        timeline = _timeline(conn, t0)
    for f in faults:
        if "error" not in f:
            f["recovery_s"] = _recovery(timeline["sync"], float(f["at_s"]))
    accepted = sync.get("statuses", {}).get("200", 0) + sync.get("statuses", {}).get("504", 0)
    audit["sync_accepted"] = accepted
    audit["sync_lost"] = max(0, accepted - audit["sync_rows"])
    refused = stack.refusals(t0, time.time(), by_second=True)
    result = {
        "refused_by_second": refused,
        "faults": faults,
        "sync": sync,
        "job_id": job_id,
        "audit": audit,
        "timeline": timeline,
    }
    log(f"faults: {faults} audit {audit} sync {sync.get('statuses')}")
    return result


def _audit(
    conn: psycopg.Connection[Any], stack: Stack, job_id: str | None, t0: float
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if job_id:
        total, succeeded, rows = conn.execute(
            "SELECT j.total_items, "
            "(SELECT count(DISTINCT r.item_index) FROM requests r "
            " WHERE r.job_id = j.job_id AND r.status = 'succeeded'), "
            "(SELECT count(*) FROM requests r WHERE r.job_id = j.job_id) "
            "FROM jobs j WHERE j.job_id = %s",
            (job_id,),
        ).fetchone()  # type: ignore[misc]
        out.update(job_items=total, job_items_succeeded=succeeded, job_rows=rows)
        out["job_items_missing"] = total - succeeded
    free = conn.execute(
        "SELECT status, count(*) FROM requests r JOIN tenants t ON t.id = r.tenant_id "
        "WHERE t.tier = 'free' AND r.job_id IS NULL AND r.received_at >= to_timestamp(%s) "
        "GROUP BY status",
        (t0,),
    ).fetchall()
    out["sync_rows_by_status"] = {s: n for s, n in free}
    out["sync_rows"] = sum(n for _, n in free)
    return out


def _timeline(conn: psycopg.Connection[Any], t0: float) -> dict[str, list[int]]:
    rows = conn.execute(
        "SELECT floor(extract(epoch FROM persisted_at) - %s)::int AS s, job_id IS NOT NULL, "
        "count(*) FROM requests WHERE persisted_at >= to_timestamp(%s) GROUP BY 1, 2 ORDER BY 1",
        (t0, t0),
    ).fetchall()
    end = max((s for s, _, _ in rows), default=0) + 1
    out = {"job": [0] * end, "sync": [0] * end}
    for s, is_job, n in rows:
        if 0 <= s < end:
            out["job" if is_job else "sync"][s] += n
    return out


def _recovery(series: list[int], at: float) -> float | None:
    """Seconds after ``at`` until the sync rows' 5 s rate is back to 80% of its median
    over the 10 s before (the sync load is offered at a constant rate throughout)."""
    k = int(at)
    before = series[max(0, k - 10) : k]
    if not before or statistics.median(before) <= 0:
        return None
    want = 0.8 * statistics.median(before)
    for s in range(k + 1, len(series)):
        window = series[s : s + 5]
        if len(window) == 5 and statistics.mean(window) >= want:
            return float(s - k)
    return None  # not back within the run
