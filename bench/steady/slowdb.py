"""Ride through a slow database: steady sync traffic, a large job submitted at the start,
and a PostgreSQL CHECKPOINT forced every minute (issue 30).

    python -m bench.steady.slowdb --rate 300 --minutes 10 --job-items 36000

Starts a system shaped like ``gristmill dev`` (PostgreSQL flushing its commits, 2 API
processes, a scheduler with 2 `sim` workers at 100 ms a batch of up to 100) and prints
one row per minute: offered, answered 200, lost (anything else, by reason), p50/p95/p99.
Writes ``slowdb-<stamp>.json`` and ``.png`` under --out, and keeps the run's logs in
``--out/slowdb-<stamp>/``. Exit status 1 if any sync request was not answered 200.
The reasons behind a refusal come twice: from the answer's message (the client's side)
and from the API's refusal counts in the request log (``refusals``); PostgreSQL's own
checkpoint log lines, /readyz each second and the sync rows' persist times per second
say what the database and the API went through.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gristmill_client import Client

from bench.steady import rig, slowdisk
from bench.steady.report import minute_rows, save, window_rows
from bench.steady.traffic import TrafficSpec, run_traffic
from bench.steady.watch import (
    Checkpoints,
    CommitProbe,
    Cpu,
    PySpyDumps,
    Readyz,
    Resources,
    Watchers,
)
from gristmill.devservices.stack import System

FINAL = ("completed", "failed", "cancelled", "expired")


class JobRun(threading.Thread):
    """Submits one job of ``items`` items at once and follows it."""

    def __init__(self, system: System, items: int, path: Path):
        super().__init__(name="job", daemon=True)
        self.system, self.items, self.path = system, items, path
        self.info: dict[str, Any] = {"items": items}

    def run(self) -> None:
        if not self.items:
            return
        gm = Client(self.system.url, self.system.keys["free"], timeout_s=600)
        t0 = time.time()
        job = gm.submit_job("sim", self.path)
        self.info.update(job_id=job["job_id"], submitted_at=t0, accepted_s=time.time() - t0)

    def finish(self, wait_s: float) -> dict[str, Any]:
        """The job's state after up to ``wait_s`` more (then it is cancelled)."""
        self.join()
        job_id = self.info.get("job_id")
        if job_id is None:
            return self.info
        gm = Client(self.system.url, self.system.keys["free"], timeout_s=60)
        deadline = time.time() + wait_s
        j = gm.job(job_id)
        while j["status"] not in FINAL and time.time() < deadline:
            time.sleep(2)
            j = gm.job(job_id)
        if j["status"] not in FINAL:
            gm.cancel(job_id)
        self.info.update(status=j["status"], counts=j["counts"], finished_at=time.time())
        return self.info


def run(args: argparse.Namespace) -> dict[str, Any]:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    work = args.out / f"slowdb-{stamp}"
    with rig.dev_like_system(
        prefix="gm-slowdb-",
        api_processes=args.api_processes,
        workers=args.workers,
        keep=work,
    ) as system:
        tag = rig.new_tag()
        job_file = work / "job.jsonl"
        rig.write_jsonl(job_file, args.job_items, f"job-{tag}")
        spec = TrafficSpec(
            url=system.url,
            key=system.keys["enterprise"],
            rate=args.rate,
            duration_s=args.minutes * 60,
            tag=tag,
        )
        lag = rig.KafkaLag(system)
        side = rig.side_dsn(system)
        readyz = Readyz(system.url)
        resources = Resources(lambda: rig.roots(system), rig.dsn(system), lag, period_s=2)
        probe = CommitProbe(side)
        cpu = Cpu(resources)
        samplers = [readyz, resources, probe, cpu]
        checkpoints: Checkpoints | None = None
        slow: slowdisk.SlowDisk | None = None
        pg = system.services.postgres
        if args.checkpoint_every > 0:
            if args.iops and pg is not None and pg.pid is not None and slowdisk.available():
                slow = slowdisk.SlowDisk(
                    side,
                    pg.pid,
                    pg.data_dir,
                    period_s=args.checkpoint_every,
                    slow_s=args.slow_s,
                    iops=args.iops,
                )
                samplers.append(slow)
            else:
                if args.iops:
                    print("no blkio throttle here: bare checkpoints", file=sys.stderr)
                checkpoints = Checkpoints(side, args.checkpoint_every, args.ballast_mb)
                samplers.append(checkpoints)
        job = JobRun(system, args.job_items, job_file)
        t0 = time.time()
        dumps = [PySpyDumps(lambda: rig.roots(system), args.dump_at, work)] if args.dump_at else []
        with Watchers(*samplers, *dumps):
            job.start()
            traffic = run_traffic(spec, processes=args.clients)
        lag.close()
        if slow is not None:
            slow.close()
        t1 = time.time() + 5
        time.sleep(5)  # the last second's refusal counts are flushed
        job_info = job.finish(args.job_wait_s)
        report: dict[str, Any] = {
            "command": " ".join(sys.argv),
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(traffic.start_wall)),
            "rate": args.rate,
            "minutes": args.minutes,
            "checkpoint_every_s": args.checkpoint_every,
            "api_processes": args.api_processes,
            "workers": args.workers,
            "start_wall": traffic.start_wall,
            "minutes_table": minute_rows(traffic),
            "windows": window_rows(traffic),
            "seconds": [dict(c) for c in traffic.seconds],
            "wrong_outputs": traffic.wrong,
            "client_cpu_s": round(traffic.client_cpu_s, 1),
            "job": job_info,
            "ballast_mb": args.ballast_mb,
            "readyz": readyz.samples,
            "resources": resources.samples,
            "commit_probe": probe.samples,
            "cpu": cpu.samples,
            "checkpoints": [x for c in (checkpoints, slow) if c is not None for x in c.samples],
            "slow_disk": None if slow is None else {"iops": args.iops, "slow_s": args.slow_s},
            "checkpoint_log": rig.checkpoint_log(system),
            "refusals": rig.refusals(system, t0, t1),
            "persist": rig.persist_seconds(system, t0, t1),
            "stages": rig.stage_seconds(system, t0, t1),
            "logs": str(work),
        }
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rate", type=float, default=300, help="sync requests/s")
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--job-items", type=int, default=36_000, help="0: no job")
    ap.add_argument("--job-wait-s", type=float, default=120, help="then the job is cancelled")
    ap.add_argument("--checkpoint-every", type=float, default=60, help="s; 0: none forced")
    ap.add_argument(
        "--iops",
        type=int,
        default=10,
        help="PostgreSQL's disk writes/s during each slow moment (0: no throttle)",
    )
    ap.add_argument("--slow-s", type=float, default=10, help="seconds each slow moment lasts")
    ap.add_argument(
        "--ballast-mb",
        type=int,
        default=0,
        help="without a throttle: MB a competing writer writes before each checkpoint",
    )
    ap.add_argument("--api-processes", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--clients", type=int, default=1, help="load-generator processes")
    ap.add_argument(
        "--dump-at",
        type=float,
        action="append",
        default=[],
        help="seconds into the run for a py-spy dump of every Python process (repeatable)",
    )
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report = run(args)
    from bench.steady.charts import slowdb_chart

    path = save(report, args.out, "slowdb", slowdb_chart)
    print(f"job: {report['job']}")
    print(f"report: {path}  chart: {path.with_suffix('.png')}  logs: {report['logs']}")
    bad = sum(r["lost"] for r in report["minutes_table"]) + report["wrong_outputs"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
