"""Charts of a whole-system GPU host run (``bench.gpuhost.run``'s JSON).

    .venv/bin/python -m bench.gpuhost.plot gpuhost.json --out docs/bench/gpuhost

Writes, for what the run holds: ``sync.png`` (latency percentiles and refusals against
the offered rate, per route), ``cpu.png`` (CPU milliseconds a request by process kind at
each rate), ``job.png`` (GPU busy through the job, against the raw ceiling) and
``faults.png`` (rows persisted each second, the faults marked), ``generation.png``
(continuous against static batching: tokens/s and time to first token). Given several runs,
``jobs.png``: their jobs side by side (phases, share of the raw ceiling), and
``syncs.png``: their sync p95 and share answered against the offered rate, and
``notify.png``: PostgreSQL's notification queue backlog at each run's top rate.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

KIND_ORDER = ("api", "scheduler", "worker", "kafka", "postgres", "load_generator")


def sync_chart(res: dict[str, Any], out: Path, plt: Any) -> None:
    rows = res["sync"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for wire in sorted({r["wire"] for r in rows}):
        rs = [r for r in rows if r["wire"] == wire]
        x = [r["offered_rps"] for r in rs]
        for q, style in (("p50_ms", "-"), ("p95_ms", "--"), ("p99_ms", ":")):
            ax.plot(x, [r[q] for r in rs], style, marker="o", label=f"{wire} {q[:3]}")
        refused = [
            100 * (r["requests"] - r["statuses"].get("200", 0)) / max(1, r["requests"]) for r in rs
        ]
        bx.plot(x, refused, marker="o", label=wire)
    ax.set(xlabel="offered requests/s", ylabel="ms (answered)", yscale="log")
    ax.axhline(300, color="grey", lw=0.8)
    ax.legend(fontsize=7)
    bx.set(xlabel="offered requests/s", ylabel="% not answered 200")
    bx.legend(fontsize=7)
    fig.suptitle(_title(res, "sync requests, open loop"))
    fig.tight_layout()
    fig.savefig(out / "sync.png", dpi=110)
    plt.close(fig)


def syncs_chart(runs: list[tuple[str, dict[str, Any]]], out: Path, plt: Any) -> None:
    """Several runs' sync requests side by side: p95 and the share answered 200 against
    the offered rate (the first route each run measured)."""
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for name, res in runs:
        rs = [r for r in res["sync"] if r["wire"] == res["sync"][0]["wire"]]
        x = [r["offered_rps"] for r in rs]
        ax.plot(x, [r["p95_ms"] for r in rs], marker="o", label=name)
        answered = [100 * r["statuses"].get("200", 0) / max(1, r["requests"]) for r in rs]
        bx.plot(x, answered, marker="o", label=name)
    ax.set(xlabel="offered requests/s", ylabel="p95 ms (answered)", yscale="log")
    ax.axhline(300, color="grey", lw=0.8)
    ax.legend(fontsize=7)
    bx.set(xlabel="offered requests/s", ylabel="% answered 200", ylim=(0, 105))
    bx.legend(fontsize=7)
    fig.suptitle("sync requests, open loop: runs compared")
    fig.tight_layout()
    fig.savefig(out / "syncs.png", dpi=110)
    plt.close(fig)


def cpu_chart(res: dict[str, Any], out: Path, plt: Any) -> None:
    rows = [r for r in res["sync"] if r["wire"] == res["sync"][0]["wire"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = [0.0] * len(rows)
    labels = [f"{r['offered_rps']:.0f}/s" for r in rows]
    for kind in KIND_ORDER:
        vals = [r["cpu"]["ms_per_request"].get(kind, 0.0) for r in rows]
        ax.bar(labels, vals, bottom=bottom, label=kind)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set(ylabel="CPU ms a request", xlabel="offered rate")
    ax.legend(fontsize=7)
    fig.suptitle(_title(res, "CPU a request by process kind"))
    fig.tight_layout()
    fig.savefig(out / "cpu.png", dpi=110)
    plt.close(fig)


def job_chart(res: dict[str, Any], out: Path, plt: Any) -> None:
    job = res["job"]
    series = job.get("gpu_busy_series") or []
    fig, ax = plt.subplots(figsize=(8, 3.5))
    if series:
        ax.plot([t for t, _ in series], [100 * u for _, u in series], lw=0.8)
    ax.axvline(job["accept_s"], color="grey", ls="--", lw=0.8, label="202 (all items durable)")
    ax.set(xlabel="s from the first byte", ylabel="GPU busy %", ylim=(0, 105))
    ax.legend(fontsize=7)
    fig.suptitle(
        _title(
            res,
            f"job of {job['items']:,} items: {job['items_per_s']:,} items/s = "
            f"{100 * (job.get('of_ceiling') or 0):.0f}% of the raw ceiling",
        )
    )
    fig.tight_layout()
    fig.savefig(out / "job.png", dpi=110)
    plt.close(fig)


def faults_chart(res: dict[str, Any], out: Path, plt: Any) -> None:
    f = res["faults"]
    fig, ax = plt.subplots(figsize=(9, 3.5))
    for kind, series in f["timeline"].items():
        ax.plot(range(len(series)), series, lw=0.9, label=f"{kind} rows/s")
    for fault in f["faults"]:
        if "error" in fault:
            continue
        ax.axvline(fault["at_s"], color="red", lw=0.8)
        rec = fault.get("recovery_s")
        ax.text(
            fault["at_s"], ax.get_ylim()[1] * 0.9, f" kill {fault['kind']}\n {rec} s", fontsize=7
        )
    ax.set(xlabel="s", ylabel="rows persisted / s")
    ax.legend(fontsize=7)
    audit = f["audit"]
    fig.suptitle(
        _title(
            res,
            f"faults: job items missing {audit.get('job_items_missing')}, "
            f"sync lost {audit.get('sync_lost')}",
        )
    )
    fig.tight_layout()
    fig.savefig(out / "faults.png", dpi=110)
    plt.close(fig)


def jobs_chart(runs: list[tuple[str, dict[str, Any]]], out: Path, plt: Any) -> None:
    """Several runs' jobs side by side: where the time from the first byte to the last
    row went (staging, the COPY and the publish until the 202, the drain after it), and
    items/s end to end against the raw ceiling."""
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8))
    names = [name for name, _ in runs]
    jobs = [res["job"] for _, res in runs]
    staged = [j.get("staged_s", 0.0) for j in jobs]
    accepted = [j["accept_s"] - j.get("staged_s", 0.0) for j in jobs]
    drained = [j["first_byte_to_last_row_s"] - j["accept_s"] for j in jobs]
    ax.barh(names, staged, label="read, checked, staged")
    ax.barh(names, accepted, left=staged, label="COPY + publish to Kafka (202)")
    left = [a + b for a, b in zip(staged, accepted, strict=True)]
    ax.barh(names, drained, left=left, label="last items computed and stored")
    ax.set(xlabel="seconds from the first byte", title="a 1,000,000-item job")
    ax.invert_yaxis()
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    # The ceiling is one GPU's; a run on several is held to it times its GPUs.
    ceilings = [j["ceiling_items_per_s"] * j.get("gpus", 1) for j in jobs]
    share = [100 * j["items_per_s"] / c for j, c in zip(jobs, ceilings, strict=True)]
    flowing = [100 * j["flowing_items_per_s"] / c for j, c in zip(jobs, ceilings, strict=True)]
    y = list(range(len(runs)))
    bx.barh([v - 0.2 for v in y], share, height=0.4, label="end to end")
    bx.barh([v + 0.2 for v in y], flowing, height=0.4, label="while items flow")
    bx.axvline(75, color="grey", lw=0.8)
    bx.set_yticks(y, names)
    bx.invert_yaxis()
    bx.set(
        xlabel="% of the raw ceiling x GPUs (same call, same inputs)",
        title="items/s",
        xlim=(0, 100),
    )
    bx.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "jobs.png", dpi=110)
    plt.close(fig)


def generation_chart(res: dict[str, Any], out: Path, plt: Any) -> None:
    """Continuous against static batching at each stream count: output tokens/s and
    time to first token (p50 and p95), through the whole system."""
    rows = res["generation"]["rows"]
    streams = sorted({r["streams"] for r in rows})
    modes = [m for m in ("continuous", "static") if any(r["mode"] == m for r in rows)]
    at = {(r["mode"], r["streams"]): r for r in rows}
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(1, len(modes))
    for i, mode in enumerate(modes):
        xs = [k + i * width for k in range(len(streams))]
        have = [(x, at[(mode, n)]) for x, n in zip(xs, streams, strict=True) if (mode, n) in at]
        ax.bar([x for x, _ in have], [r["tokens_per_s"] for _, r in have], width, label=mode)
        bx.bar(
            [x for x, _ in have], [r["ttft_p95_ms"] for _, r in have], width, label=f"{mode} p95"
        )
        bx.plot([x for x, _ in have], [r["ttft_p50_ms"] for _, r in have], "k_", ms=14)
    ticks = [k + width * (len(modes) - 1) / 2 for k in range(len(streams))]
    for axis in (ax, bx):
        axis.set_xticks(ticks, [f"{n} streams" for n in streams])
        axis.legend(fontsize=7)
    ax.set(ylabel="output tokens/s")
    bx.set(ylabel="time to first token, ms (bar p95, tick p50)", yscale="log")
    fig.suptitle(_title(res, "generation through /v1/completions, closed loop"))
    fig.tight_layout()
    fig.savefig(out / "generation.png", dpi=110)
    plt.close(fig)


def notify_chart(runs: list[tuple[str, dict[str, Any]]], out: Path, plt: Any) -> None:
    """PostgreSQL's notification queue backlog (what its slowest listener has yet to
    read) each second of each run's top rate, where the run recorded it: the way the
    sync answers travel (decision 71)."""
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for name, res in runs:
        top = max(res["sync"], key=lambda r: r["offered_rps"])
        series = top.get("pg_waits", {}).get("notify_queue_mb", {}).get("by_s")
        if series:
            label = f"{name} ({top['wire']}, {top['offered_rps']:.0f}/s)"
            ax.plot(range(1, len(series) + 1), [max(v, 1e-3) for v in series], label=label)
    ax.set(xlabel="second of the run", ylabel="notify queue backlog, MiB", yscale="log")
    ax.legend(fontsize=7)
    fig.suptitle("PostgreSQL's notification queue during sync load")
    fig.tight_layout()
    fig.savefig(out / "notify.png", dpi=110)
    plt.close(fig)


def mixed_chart(runs: list[tuple[str, dict[str, Any]]], out: Path, plt: Any) -> None:
    """Sync requests beside a job, second by second: the median of each stage in the
    request log (where a late answer's time went) and the requests that ended 504, with
    the second the job's first item was consumed marked. Runs that recorded the batch's
    worker times (migration 0030) show ``dispatch`` in its three parts."""
    parts = ("to_worker", "worker_queue", "device_queue")
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 3.2 * len(runs)), squeeze=False)
    for ax, (name, res) in zip(axes[:, 0], runs, strict=True):
        job = res["mixed"]["job"]
        beside = job["beside"]
        rows = [r for r in beside.get("stages_by_s", []) if r["requests"]]
        split = any(r.get(parts[0]) for r in rows)
        middle = parts if split else ("dispatch",)
        stages = ("queue", "batch_wait", *middle, "compute", "persist")
        secs = [r["s"] for r in rows]
        bottom = [0.0] * len(rows)
        for stage in stages:
            vals = [(r.get(stage) or [0.0])[0] for r in rows]
            ax.bar(secs, vals, bottom=bottom, width=1.0, label=stage)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.axvline(job["first_consumed_s"], color="black", ls="--", lw=0.8)
        ax.text(job["first_consumed_s"], max(bottom or [1]), " job items flow", fontsize=7)
        twin = ax.twinx()
        # The load generator counts from its first request, which came a few seconds
        # after the job's submission began (its processes start first): align them.
        failed = beside.get("failed_by_s") or []
        start = secs[0] if secs else 0
        twin.plot([start + i for i in range(len(failed))], failed, color="red", lw=1.0)
        twin.set_ylabel("504 a second", color="red")
        ax.set(xlabel="seconds since the job's submission began", ylabel="median ms a stage")
        ax.set_title(
            f"{name}: p95 {beside['p95_ms']:.0f} ms beside the job, "
            f"{res['mixed']['alone']['p95_ms']:.0f} ms alone",
            fontsize=9,
        )
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(_title(runs[0][1], "sync /v1/infer at 2,000/s beside a 1,000,000-item job"))
    fig.tight_layout()
    fig.savefig(out / "mixed-stages.png", dpi=110)
    plt.close(fig)


def _title(res: dict[str, Any], what: str) -> str:
    gpus = ", ".join(res.get("machine", {}).get("gpus", [])) or "no GPU"
    return f"{what}\n{gpus.split(',')[0]}, {res.get('machine', {}).get('cores')} cores"


def main(argv: list[str] | None = None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ap = argparse.ArgumentParser()
    ap.add_argument("result", type=Path, nargs="+", help="several: their jobs compared")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if len(args.result) > 1:
        runs = [(p.stem, json.loads(p.read_text())) for p in args.result]
        if any(r.get("job") for _, r in runs):
            jobs_chart([(n, r) for n, r in runs if r.get("job")], args.out, plt)
        mixed = [(n, r) for n, r in runs if r.get("mixed", {}).get("job", {}).get("beside")]
        if mixed:
            mixed_chart(mixed, args.out, plt)
        if any(r.get("sync") for _, r in runs):
            syncs = [(n, r) for n, r in runs if r.get("sync")]
            syncs_chart(syncs, args.out, plt)
            notify_chart(syncs, args.out, plt)
        return 0
    res = json.loads(args.result[0].read_text())
    for key, draw in (
        ("sync", sync_chart),
        ("sync", cpu_chart),
        ("job", job_chart),
        ("faults", faults_chart),
        ("generation", generation_chart),
    ):
        if res.get(key):
            draw(res, args.out, plt)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
