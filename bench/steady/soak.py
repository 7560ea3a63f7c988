"""The soak: sync traffic at a share of capacity with jobs beside it, for an hour or more
(issue 30), checked the way an operator would check a night's run.

    python -m bench.steady.soak --minutes 60                     # the hour (docs/bench/soak.md)
    python -m bench.steady.soak --minutes 10 --rate 400          # a validation run

Starts a system shaped like ``gristmill dev`` (bench/steady/rig.py), offers ``--load`` of
``--capacity`` as sync requests/s (or ``--rate``), submits a job of ``--job-items`` every
``--job-every`` seconds (by default half of the capacity the sync traffic leaves), and
records every 10 s the resident memory and CPU of every process, PostgreSQL's table and
index sizes and the consumer groups' Kafka lag. At the end it checks:

* nothing refused or lost: every sync request answered 200, every job item succeeded;
* p95 steady: the p95 of the last ``--compare-min`` minutes within 15% of the first
  ``--compare-min`` minutes after the warm-up;
* memory flat: each process's private memory (USS) at the end within 5% of the warm-up's
  end, or less than 1 MiB above it (medians of the samples of each window; processes
  alive in both); an API process against the highest of its replicas' (the one whose
  first upload comes late reaches their level then), a PostgreSQL backend with
  ``work_mem`` as its floor (``memory_check``);
* PostgreSQL bounded by retention: the request log's bytes per stored row do not grow
  (the log grows with its rows until retention drops whole partitions, which takes days),
  and no other table grows past the warm-up by more than 1 MiB;
* Kafka lag bounded: the sync topics never lag more than two seconds of traffic, and the
  jobs topic is back to zero before the run ends.

Writes ``soak-<stamp>.json`` and ``.png`` under --out; exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gristmill_client import Client

from bench.steady import rig
from bench.steady.report import minute_rows, save, window_rows
from bench.steady.traffic import Traffic, TrafficSpec, pct_ms, run_traffic
from bench.steady.watch import Readyz, Resources, Watchers
from gristmill.devservices.stack import System

SIM_CAPACITY = 2 * 100 / 0.100  # 2 sim workers x 100 items per 100 ms batch
P95_TOLERANCE = 0.15
RSS_TOLERANCE = 0.05
# A process of a few MiB (PostgreSQL's checkpointer, an idle backend) moves by hundreds of
# KiB as its caches and request queues fill: growth under this many MiB passes whatever
# its share, and the report marks each process that passed by it ("floor").
RSS_FLOOR_MB = 1.0
# Roots whose children are replicas of each other (uvicorn's processes of one API).
REPLICA_ROOTS = ("api",)
OTHER_TABLE_GROWTH_MB = 1.0
LOG_TABLES = ("requests", "batches", "job_items", "refusals", "answer_timeouts")
FINAL = ("completed", "failed", "cancelled", "expired")


class Jobs(threading.Thread):
    """A job of ``items`` every ``every_s`` until stopped."""

    def __init__(self, system: System, items: int, every_s: float, work: Path):
        super().__init__(name="jobs", daemon=True)
        self.system, self.items, self.every_s = system, items, every_s
        self.path = work / "soak-job.jsonl"
        rig.write_jsonl(self.path, items, f"soak-{rig.new_tag()}")
        self.submitted: list[dict[str, Any]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        gm = Client(self.system.url, self.system.keys["free"], timeout_s=600)
        while not self._halt.is_set():
            t0 = time.time()
            try:
                job = gm.submit_job("sim", self.path)
                self.submitted.append({"job_id": job["job_id"], "submitted_at": t0})
            except Exception as exc:  # counted: a refused job is a finding
                self.submitted.append({"error": str(exc)[:200], "submitted_at": t0})
            self._halt.wait(max(0.0, self.every_s - (time.time() - t0)))

    def finish(self, wait_s: float) -> list[dict[str, Any]]:
        self._halt.set()
        self.join()
        gm = Client(self.system.url, self.system.keys["free"], timeout_s=60)
        deadline = time.time() + wait_s
        for j in self.submitted:
            if "job_id" not in j:
                continue
            got = gm.job(j["job_id"])
            while got["status"] not in FINAL and time.time() < deadline:
                time.sleep(2)
                got = gm.job(j["job_id"])
            j.update(status=got["status"], counts=got["counts"])
        return self.submitted


def _private(sample: dict[str, Any], name: str) -> float:
    p = sample["processes"][name]
    return float(p.get("uss_mb") or p["rss_mb"])


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _window(samples: list[dict[str, Any]], t0: float, t1: float) -> list[dict[str, Any]]:
    return [s for s in samples if t0 <= s["t"] < t1]


def _replica_group(name: str, sample: dict[str, Any]) -> str | None:
    """The group of interchangeable processes a sampled process belongs to: uvicorn's API
    processes (spawned children of the ``api`` root) serve the same port with the same
    code, and which of them takes a job's upload is the kernel's choice."""
    root, _, pid = name.partition("/")
    return root if root in REPLICA_ROOTS and pid and sample.get("spawned") else None


def memory_check(
    early: list[dict[str, Any]], late: list[dict[str, Any]], work_mem_mb: float | None
) -> dict[str, Any]:
    """Each process's private memory (USS) at the end against its warmed level: the
    median of its samples in the window after the warm-up, or for an API process the
    highest such median among its replicas (a process whose first uploads come after
    the warm-up climbs to the level the others reached at theirs: that is a high-water
    mark the warm-up did not see, not a growth with time; one that leaks passes its
    replicas' level too). A PostgreSQL backend's floor is ``work_mem``: one sort or hash
    may take that much, and the backend's allocator keeps it. Pure."""
    # USS: a PostgreSQL backend's RSS grows with the shared buffers it touches, which is
    # no leak. Processes alive in both windows (pids in the labels).
    warm = {
        name: m
        for name in sorted({p for s in early for p in s["processes"]})
        if (m := _median([_private(s, name) for s in early if name in s["processes"]]))
    }
    groups = {name: _replica_group(name, p) for s in early for name, p in s["processes"].items()}
    band: dict[str, float] = {}
    for name, m in warm.items():
        if (group := groups.get(name)) is not None:
            band[group] = max(band.get(group, 0.0), m)
    growth = {}
    for name in sorted({p for s in late for p in s["processes"]}):
        own = warm.get(name)
        b = _median([_private(s, name) for s in late if name in s["processes"]])
        if not own or not b:
            continue
        group = groups.get(name)
        a = max(own, band[group]) if group is not None else own
        floor = RSS_FLOOR_MB
        if name.startswith("postgres/") and work_mem_mb:
            floor = max(floor, work_mem_mb)
        g = growth[name] = {"warm_mb": own, "end_mb": b, "growth": round(b / a - 1, 4)}
        if a != own:
            g["replicas_warm_mb"] = a
        g["ok"] = g["growth"] < RSS_TOLERANCE or b - a < floor
        if g["ok"] and g["growth"] >= RSS_TOLERANCE:
            g["floor_mb"] = floor
    return {
        "ok": bool(growth) and all(g["ok"] for g in growth.values()),
        "tolerance": RSS_TOLERANCE,
        "floor_mb": RSS_FLOOR_MB,
        "postgres_backend_floor_mb": work_mem_mb,
        "processes": growth,
    }


def checks(report: dict[str, Any], traffic: Traffic, compare_s: float, warm_s: float) -> dict:
    """The soak's verdicts, each with the numbers behind it."""
    out: dict[str, Any] = {}
    rows = report["minutes_table"]
    lost = sum(r["lost"] for r in rows)
    bad_items = sum(
        (j.get("counts") or {}).get("total", 0) - (j.get("counts") or {}).get("succeeded", 0)
        for j in report["jobs"]
    )
    refused_jobs = sum(1 for j in report["jobs"] if "error" in j)
    out["nothing_lost"] = {
        "ok": lost == 0 and bad_items == 0 and refused_jobs == 0 and traffic.wrong == 0,
        "sync_not_200": lost,
        "job_items_not_succeeded": bad_items,
        "jobs_refused": refused_jobs,
        "wrong_outputs": traffic.wrong,
    }
    end = traffic.spec.duration_s
    first = pct_ms(traffic.latency(warm_s, warm_s + compare_s), 95)
    last = pct_ms(traffic.latency(end - compare_s, end), 95)
    out["p95_steady"] = {
        "ok": first is not None and last is not None and last <= first * (1 + P95_TOLERANCE),
        "first_ms": first,
        "last_ms": last,
        "window_s": compare_s,
    }
    start = report["start_wall"]
    res = report["resources"]
    early = _window(res, start + warm_s, start + warm_s + compare_s)
    late = _window(res, start + end - compare_s, start + end + 1)
    out["memory_flat"] = memory_check(early, late, report.get("postgres_work_mem_mb"))
    out["postgres_bounded"] = _tables(early, late)
    out["kafka_lag_bounded"] = _lag(res, start + warm_s, traffic.spec.rate)
    return out


def _tables(early: list[dict[str, Any]], late: list[dict[str, Any]]) -> dict[str, Any]:
    if not early or not late:
        return {"ok": False, "why": "no samples"}
    a, b = early[0], late[-1]
    per_row = {}
    for name in ("requests",):
        for s, key in ((a, "warm"), (b, "end")):
            t = s["tables"].get(name, {})
            rows = t.get("rows")
            if rows:
                size = (t.get("table_mb", 0) + t.get("index_mb", 0)) * 2**20
                per_row[f"{name}_{key}_bytes_per_row"] = round(size / rows, 1)
    grew = {}
    for name, t in b["tables"].items():
        if name in LOG_TABLES or name not in a["tables"]:
            continue
        before = a["tables"][name]["table_mb"] + a["tables"][name]["index_mb"]
        after = t["table_mb"] + t["index_mb"]
        if after - before > OTHER_TABLE_GROWTH_MB:
            grew[name] = {"warm_mb": round(before, 2), "end_mb": round(after, 2)}
    warm_bpr = per_row.get("requests_warm_bytes_per_row")
    end_bpr = per_row.get("requests_end_bytes_per_row")
    # A few percent of slack: the last partition's pages fill unevenly.
    log_ok = warm_bpr is not None and end_bpr is not None and end_bpr <= warm_bpr * 1.1
    return {"ok": log_ok and not grew, **per_row, "other_tables_grown": grew}


def _lag(res: list[dict[str, Any]], after: float, rate: float) -> dict[str, Any]:
    sync_max = max(
        (n for s in res if s["t"] >= after for k, n in (s.get("lag") or {}).items() if k != "jobs"),
        default=0,
    )
    jobs_end = (res[-1].get("lag") or {}).get("jobs") if res else None
    return {
        "ok": sync_max <= 2 * rate and (jobs_end or 0) == 0,
        "sync_max_messages": sync_max,
        "jobs_at_end": jobs_end,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    rate = args.rate or args.load * args.capacity
    job_items = args.job_items
    if job_items is None:
        job_items = int((args.capacity - rate) * args.job_every * 0.5)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    work = args.out / f"soak-{stamp}"
    with rig.dev_like_system(prefix="gm-soak-", keep=work) as system:
        spec = TrafficSpec(
            url=system.url,
            key=system.keys["enterprise"],
            rate=rate,
            duration_s=args.minutes * 60,
            tag=rig.new_tag(),
        )
        lag = rig.KafkaLag(system)
        readyz = Readyz(system.url, period_s=5)
        resources = Resources(lambda: rig.roots(system), rig.dsn(system), lag, period_s=10)
        jobs = Jobs(system, job_items, args.job_every, work) if job_items > 0 else None
        with Watchers(readyz, resources):
            if jobs is not None:
                jobs.start()
            traffic = run_traffic(spec, processes=args.clients)
            job_info = jobs.finish(args.job_wait_s) if jobs is not None else []
            time.sleep(10)  # one more sample once the jobs are done
        lag.close()
        report: dict[str, Any] = {
            "soak": True,
            "command": " ".join(sys.argv),
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(traffic.start_wall)),
            "rate": rate,
            "minutes": args.minutes,
            "capacity": args.capacity,
            "job_items": job_items,
            "job_every_s": args.job_every,
            "start_wall": traffic.start_wall,
            "minutes_table": minute_rows(traffic),
            "windows": window_rows(traffic),
            "seconds": [dict(c) for c in traffic.seconds],
            "jobs": job_info,
            "readyz": readyz.samples,
            "resources": resources.samples,
            "checkpoint_log": rig.checkpoint_log(system),
            "postgres_work_mem_mb": rig.work_mem_mb(system),
            "logs": str(work),
        }
    compare_s = 60 * (args.compare_min or min(10.0, args.minutes / 5))
    warm_s = 60 * (args.warmup_min if args.warmup_min is not None else min(5.0, args.minutes / 10))
    report["checks"] = checks(report, traffic, compare_s, warm_s)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--capacity", type=float, default=SIM_CAPACITY, help="items/s of the workers")
    ap.add_argument("--load", type=float, default=0.6, help="sync share of --capacity")
    ap.add_argument("--rate", type=float, default=0, help="sync requests/s (overrides --load)")
    ap.add_argument("--job-every", type=float, default=300, help="seconds between jobs")
    ap.add_argument("--job-items", type=int, default=None, help="default: half the spare")
    ap.add_argument("--job-wait-s", type=float, default=300)
    ap.add_argument("--warmup-min", type=float, default=None, help="default: min(5, minutes/10)")
    ap.add_argument("--compare-min", type=float, default=None, help="default: min(10, minutes/5)")
    ap.add_argument("--clients", type=int, default=2, help="load-generator processes")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report = run(args)
    from bench.steady.soak_charts import soak_chart

    path = save(report, args.out, "soak", soak_chart)
    for name, c in report["checks"].items():
        print(f"{'PASS' if c['ok'] else 'FAIL'} {name}: {json.dumps(c)}")
    print(f"report: {path}  chart: {path.with_suffix('.png')}  logs: {report['logs']}")
    return 0 if all(c["ok"] for c in report["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
