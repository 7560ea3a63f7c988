"""Fixed-rate load against Gristmill, several runs, with percentiles and a chart.

    python -m bench.loadtest --rate 200 --count 1000 --runs 3

Without --url it starts its own system on loopback (Kafka, PostgreSQL, API, a
scheduler with 2 `sim` workers); with --url/--key it drives a running one
(`make dev` writes both to .gristmill/dev.env). Every answer is checked to be
the caller's own (sim's output is derived from its input).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bench.openloop import RunResult, run_open_loop
from core.models.sim import sim_output


def read_dev_env(path: Path = Path(".gristmill/dev.env")) -> dict[str, str]:
    if not path.exists():
        return {}
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def one_run(url: str, key: str, rate: float, count: int, run: int) -> tuple[RunResult, int]:
    tag = uuid.uuid4().hex[:6]
    inputs = [f"load-{tag}-{i}" for i in range(count)]
    bar = tqdm(total=count, desc=f"run {run} @ {rate:g}/s", unit="req", leave=False)
    res = asyncio.run(
        run_open_loop(
            url=f"{url}/v1/infer",
            headers={"Authorization": f"Bearer {key}"},
            rate=rate,
            count=count,
            make_body=lambda i: {"model": "sim", "input": inputs[i]},
            on_done=lambda s: bar.update(1),
        )
    )
    bar.close()
    wrong = sum(
        1
        for s in res.ok
        if s.body is None or s.body["output"] != sim_output(inputs[round(s.intended * rate)])
    )
    return res, wrong


def draw(results: list[RunResult], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for i, r in enumerate(results, 1):
        xs = sorted(s.latency_ms for s in r.ok)
        ax1.plot(xs, [j / len(xs) for j in range(len(xs))], label=f"run {i}")
        ax2.scatter([s.intended for s in r.ok], [s.latency_ms for s in r.ok], s=2, label=f"run {i}")
    ax1.set(
        xlabel="latency from intended send (ms)", ylabel="fraction of requests", title="latency CDF"
    )
    ax1.grid(alpha=0.3)
    ax1.legend()
    ax2.set(xlabel="intended send time (s)", ylabel="latency (ms)", title="latency over the run")
    ax2.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--url")
    ap.add_argument("--key")
    ap.add_argument("--rate", type=float, default=200)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    with ExitStack() as stack:
        url, key = args.url, args.key
        where = "a running system"
        if not url:
            from bench.system import sim_system

            print("starting Kafka, PostgreSQL, API and scheduler ...", file=sys.stderr)
            system = sim_system(stack, "gm-bench-", workers=args.workers)
            url, key = system.url, system.keys["enterprise"]
            where = f"a self-started system ({args.workers} sim workers, 100 ms/batch)"
        elif not key:
            key = read_dev_env().get("GRISTMILL_API_KEY")
        results: list[RunResult] = []
        rows: list[dict[str, Any]] = []
        for run in range(1, args.runs + 1):
            res, wrong = one_run(url, key or "", args.rate, args.count, run)
            results.append(res)
            row = {"run": run, **res.summary(), "wrong_outputs": wrong}
            rows.append(row)
            print(json.dumps(row))
            time.sleep(1)

    summary = {k: statistics.median(r[k] for r in rows) for k in ("p50_ms", "p95_ms", "p99_ms")}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    report = {
        "target": where,
        "rate": args.rate,
        "count": args.count,
        "runs": rows,
        "median_of_runs": summary,
    }
    (args.out / f"loadtest-{stamp}.json").write_text(json.dumps(report, indent=2))
    chart = args.out / f"loadtest-{stamp}.png"
    draw(results, chart, f"{args.count} requests at {args.rate:g}/s, {where}")
    print(f"\n{args.runs} runs of {args.count} requests at {args.rate:g}/s against {where}")
    print(
        f"{'run':>4} {'p50':>8} {'p95':>8} {'p99':>8} {'max':>8} {'rps':>7} {'batch':>6}  statuses"
    )
    for r in rows:
        print(
            f"{r['run']:>4} {r['p50_ms']:>8} {r['p95_ms']:>8} {r['p99_ms']:>8} {r['max_ms']:>8} "
            f"{r['achieved_rps']:>7} {r['mean_batch_size']!s:>6}  {r['statuses']}"
            f"{'  WRONG OUTPUTS: ' + str(r['wrong_outputs']) if r['wrong_outputs'] else ''}"
        )
    print(
        f"median of runs: p50 {summary['p50_ms']} ms, p95 {summary['p95_ms']} ms, "
        f"p99 {summary['p99_ms']} ms;  chart: {chart}"
    )
    bad = any(r["wrong_outputs"] or set(r["statuses"]) != {200} for r in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
