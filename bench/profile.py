"""CPU cost per request of each Gristmill process at a steady rate, plus py-spy hot spots.

    python -m bench.profile --rate 500 --duration 30 --out docs/bench

Starts its own system (Kafka, PostgreSQL, API, scheduler with 2 ``sim`` workers), warms
it up, then drives an open-loop load while (1) psutil reads each process's CPU seconds
before and after and (2) ``py-spy record --format raw --nonblocking`` samples the API and
the scheduler. Writes profile.json and profile.md; prints the table and the hot spots.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from bench.openloop import LoadSpec, run_load
from bench.peers.procs import cpu_seconds, thread_cpu, tree
from bench.peers.targets import GristmillTarget

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")
PROJECT = ("ingest/", "scheduler/", "workers/", "results/", "gristmill/")
# Leaf frames that are a thread blocked, not burning CPU (a C call under a Python frame).
WAITING = {
    "Condition.wait", "Event.wait", "socket.accept", "_worker", "EpollSelector.select",
    "_PollLikeSelector.select", "Connection.wait", "select", "sleep",
}  # fmt: skip


def role_pids(t: GristmillTarget) -> dict[str, list[tuple[int, bool]]]:
    """Role -> (pid, with descendants). The scheduler's children are its workers."""
    roles = t.roles()
    sched = roles["scheduler+workers"][0]
    return {
        "api": [(p, True) for p in roles["api"]],
        "scheduler": [(sched, False)],
        "workers": [(p.pid, True) for p in tree(sched)[1:] if p.ppid() == sched],
        "kafka": [(p, True) for p in roles["kafka"]],
        "postgres": [(p, True) for p in roles["postgres"]],
    }


def cpu_by_role(roles: dict[str, list[tuple[int, bool]]]) -> dict[str, float]:
    return {r: sum(cpu_seconds(p, rec) for p, rec in pids) for r, pids in roles.items()}


# Roles whose threads are broken down (the workers sleep; PostgreSQL has one per backend).
THREAD_ROLES = ("api", "scheduler", "kafka")


def threads_by_role(roles: dict[str, list[tuple[int, bool]]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for r in THREAD_ROLES:
        acc: dict[str, float] = {}
        for pid, rec in roles[r]:
            for name, s in thread_cpu(pid, rec).items():
                acc[name] = acc.get(name, 0.0) + s
        out[r] = acc
    return out


def thread_table(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], ok: int, top: int = 6
) -> dict[str, list[list[Any]]]:
    """Per role, the threads that used the most CPU: [name, ms per request]."""
    out = {}
    for r, names in after.items():
        used = {n: s - before[r].get(n, 0.0) for n, s in names.items()}
        best = sorted(used.items(), key=lambda kv: -kv[1])[:top]
        out[r] = [[n, round(1000 * s / ok, 3)] for n, s in best if s > 0]
    return out


def py_spy() -> str:
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else "py-spy"


def start_spy(
    pid: int, out: Path, duration_s: float, subprocesses: bool = False, native: bool = False
) -> subprocess.Popen[bytes]:
    argv = [py_spy(), "record", "--pid", str(pid), "--duration", str(int(duration_s))]
    if subprocesses:  # the API: several uvicorn processes under one supervisor
        argv += ["--subprocesses"]
    # --nonblocking: pausing the process at 100 Hz would itself add latency; py-spy's idle
    # detection is weaker then, so known blocking waits are set apart in hot_spots().
    # --native (C frames: what the event loop, librdkafka or psycopg spend) must pause it.
    argv += ["--native"] if native else ["--nonblocking"]
    argv += ["--rate", "100", "--format", "raw", "--output", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _short(frame: str) -> tuple[str, str]:
    m = FRAME.match(frame.strip())
    if not m:
        return frame.strip(), ""
    path = m["file"]
    for marker in ("site-packages/", "python3.11/", "/work/main/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return m["func"], path


def hot_spots(raw: Path, top: int = 12) -> dict[str, Any]:
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = waiting = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        frames = [_short(f) for f in stack.split(";")]
        func, path = frames[-1]
        if func in WAITING:
            waiting += count
            continue
        total += count
        own[f"{func} ({path})"] += count
        for f in {f"{fn} ({p})" for fn, p in frames if p.startswith(PROJECT)}:
            incl[f] += count

    def pct(c: Counter[str]) -> list[list[Any]]:
        return [[k, round(100 * v / total, 1)] for k, v in c.most_common(top)] if total else []

    return {
        "busy_samples": total,
        "waiting_samples": waiting,
        "self_pct": pct(own),
        "project_inclusive_pct": pct(incl),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rate", type=float, default=500)
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--warmup", type=float, default=60, help="seconds at --rate, not measured")
    ap.add_argument("--idle", type=float, default=10, help="seconds of idle CPU measured first")
    ap.add_argument("--no-spy", action="store_true", help="CPU accounting only")
    ap.add_argument("--keep-raw", action="store_true", help="keep py-spy's raw stacks in --out")
    ap.add_argument(
        "--native", action="store_true", help="C frames too (py-spy pauses the processes)"
    )
    ap.add_argument("--out", type=Path, default=Path("bench-out") / time.strftime("prof-%H%M%S"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    t = GristmillTarget()
    try:
        print("starting gristmill ...", file=sys.stderr, flush=True)
        t.start()
        # Warm at the measured rate: the broker's JIT compiler is otherwise a third of
        # Kafka's CPU in the first seconds at a new rate, which is not the steady cost.
        warm = LoadSpec(t.url, t.headers, args.rate, args.warmup, tag=f"warm-{uuid.uuid4().hex}")
        run_load(warm, processes=args.clients)
        time.sleep(2)
        roles = role_pids(t)
        # Idle cost first: what each process burns with no traffic (polling, heartbeats).
        i0, t0 = cpu_by_role(roles), time.monotonic()
        time.sleep(args.idle)
        i1, idle_s = cpu_by_role(roles), time.monotonic() - t0
        load1 = os.getloadavg()[0]
        spies: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        raw_dir = args.out if args.keep_raw else Path(t.workdir)
        if not args.no_spy:
            for role in ("api", "scheduler"):
                raw = raw_dir / f"pyspy-{role}.txt"
                # +2 s: the load processes take ~2 s to start their shared schedule.
                spies[role] = (
                    start_spy(
                        roles[role][0][0], raw, args.duration + 2, role == "api", args.native
                    ),
                    raw,
                )
        c0, th0 = cpu_by_role(roles), threads_by_role(roles)
        spec = LoadSpec(t.url, t.headers, args.rate, args.duration, tag=f"pr-{uuid.uuid4().hex}")
        res = run_load(spec, processes=args.clients)
        c1, th1 = cpu_by_role(roles), threads_by_role(roles)
        hot = {}
        for role, (proc, raw) in spies.items():
            _, err = proc.communicate(timeout=60)
            hot[role] = hot_spots(raw) if raw.exists() else {"error": err.decode()[-500:]}
    finally:
        t.stop()
    ok = res.statuses.get("200", 0) or 1
    cpu = {
        r: {
            "cpu_s": round(c1[r] - c0[r], 2),
            "ms_per_request": round(1000 * (c1[r] - c0[r]) / ok, 3),
            "cores": round((c1[r] - c0[r]) / res.window_s, 2),
            "idle_cores": round((i1[r] - i0[r]) / idle_s, 3),
        }
        for r in c0
    }
    total_ms = round(sum(v["ms_per_request"] for v in cpu.values()), 3)
    report = {
        "rate": args.rate,
        "duration_s": args.duration,
        "load1_before": round(load1, 2),
        "load": res.summary(),
        "cpu": cpu,
        "total_cpu_ms_per_request": total_ms,
        "threads_ms_per_request": thread_table(th0, th1, ok),
        "hot_spots": hot,
    }
    (args.out / "profile.json").write_text(json.dumps(report, indent=1))
    md = render(report)
    (args.out / "profile.md").write_text(md)
    print(md)
    return 0


def render(rep: dict[str, Any]) -> str:
    s = rep["load"]
    lines = [
        f"{rep['rate']:g} req/s offered for {rep['duration_s']:g} s (load1 before "
        f"{rep['load1_before']}): {s['achieved_rps']} req/s answered, p50 {s['p50_ms']} ms, "
        f"p95 {s['p95_ms']} ms, statuses {s['statuses']}, client CPU {s['client_cpu_cores']} "
        "cores",
        "",
        "| process | CPU s | CPU ms / request | cores under load | cores idle |",
        "|---|---|---|---|---|",
    ]
    for role, v in rep["cpu"].items():
        lines.append(
            f"| {role} | {v['cpu_s']} | {v['ms_per_request']} | {v['cores']} "
            f"| {v.get('idle_cores', '-')} |"
        )
    lines.append(f"| **total** | | **{rep['total_cpu_ms_per_request']}** | | |")
    threads = rep.get("threads_ms_per_request", {})
    if threads:
        lines += ["", "Busiest threads (CPU ms per request; `rdk:*` are librdkafka's own):", ""]
        for role, rows in threads.items():
            lines.append(f"- {role}: " + ", ".join(f"`{n}` {ms}" for n, ms in rows))
    for role, h in rep["hot_spots"].items():
        lines += [
            "",
            f"### {role}: py-spy, % of {h.get('busy_samples', 0)} busy samples "
            f"({h.get('waiting_samples', 0)} samples in blocking waits left out)",
            "",
        ]
        lines += [f"- self {p}%: `{k}`" for k, p in h.get("self_pct", [])[:10]]
        lines += [f"- incl. {p}%: `{k}`" for k, p in h.get("project_inclusive_pct", [])[:10]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
