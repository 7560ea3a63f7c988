"""Charts of the long runs (bench/steady/): outcomes by the second, latency by window,
what the database and the API went through, and the soak's resources over time.

    python -m bench.steady.charts bench-out/slowdb-<stamp>.json   # redraw from a report
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _outcomes(ax: Any, report: dict[str, Any]) -> None:
    seconds = report["seconds"]
    xs = list(range(len(seconds)))
    ok = [s.get("200", 0) for s in seconds]
    r503 = [sum(n for k, n in s.items() if k.startswith("503")) for s in seconds]
    r504 = [sum(n for k, n in s.items() if k.startswith("504")) for s in seconds]
    rest = [sum(s.values()) - a - b - c for s, a, b, c in zip(seconds, ok, r503, r504, strict=True)]
    ax.stackplot(
        xs,
        ok,
        r503,
        r504,
        rest,
        labels=["200", "503", "504", "no answer / other"],
        colors=["tab:green", "tab:red", "tab:orange", "tab:gray"],
        step="post",
    )
    ax.set(xlabel="second of the run (when the request was due)", ylabel="requests")
    ax.legend(loc="lower left", fontsize=8)
    ax.grid(alpha=0.3)


def _marks(axes: list[Any], report: dict[str, Any]) -> None:
    start = report["start_wall"]
    for c in report.get("checkpoints", []):
        for ax in axes:
            ax.axvline(c["t"] - start, color="tab:purple", lw=0.8, ls="--")
            if c.get("slow_s"):  # the disk throttled meanwhile
                ax.axvspan(
                    c["t"] - start, c["t"] - start + c["slow_s"], color="tab:purple", alpha=0.1
                )
    job = report.get("job") or {}
    if job.get("submitted_at"):
        for ax in axes:
            ax.axvline(job["submitted_at"] - start, color="black", lw=0.8, ls=":")


def _latency(ax: Any, report: dict[str, Any]) -> None:
    rows = report.get("windows") or []
    xs = [r["t0"] + r["seconds"] / 2 for r in rows]
    for key, style in (("p50_ms", ":"), ("p95_ms", "--"), ("p99_ms", "-")):
        ys = [r[key] if r[key] is not None else float("nan") for r in rows]
        ax.plot(xs, ys, style, marker="o", ms=2, label=key[:-3])
    step = rows[0]["seconds"] if rows else 0
    ax.set(ylabel=f"sync latency of 200s per {step:g} s (ms)", yscale="log")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


def _database(ax: Any, report: dict[str, Any]) -> None:
    start = report["start_wall"]
    p = report.get("persist", [])
    ax.plot(
        [r["t"] - start for r in p],
        [r["sync_persist_p95_ms"] or float("nan") for r in p],
        lw=0.8,
        label="sync rows: compute end to persist, p95 (ms)",
    )
    cp = report.get("commit_probe", [])
    ax.plot(
        [r["t"] - start for r in cp],
        [r["ms"] for r in cp],
        lw=0.6,
        color="tab:gray",
        label="a one-row commit (ms, probe every 100 ms)",
    )
    rz = [r for r in report.get("readyz", []) if r.get("answer_delay_ms") is not None]
    ax.plot(
        [r["t"] - start for r in rz],
        [r["answer_delay_ms"] for r in rz],
        lw=0.8,
        label="API answer delay (ms, /readyz)",
    )
    down = [r["t"] - start for r in report.get("readyz", []) if r.get("status") != 200]
    if down:
        label = "/readyz not 200 (or no answer in 2 s)"
        ax.scatter(down, [1] * len(down), marker="x", color="tab:red", label=label)
    ax.set(ylabel="ms", yscale="symlog", xlabel="second of the run")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)


def slowdb_chart(report: dict[str, Any], path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    _outcomes(axes[0], report)
    _latency(axes[1], report)
    _database(axes[2], report)
    _marks(list(axes), report)
    title = (
        f"{report['rate']:g} sync req/s for {report['minutes']:g} min, "
        f"{(report.get('job') or {}).get('items', 0):,}-item job at the start, CHECKPOINT every "
        f"{report['checkpoint_every_s']:g} s (dashed); {report['api_processes']} API processes, "
        f"{report['workers']} sim workers"
    )
    finish(fig, path, title)


def finish(fig: Any, path: Path, title: str) -> None:
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    _plt().close(fig)


def main(argv: list[str] | None = None) -> int:
    for name in argv if argv is not None else sys.argv[1:]:
        path = Path(name)
        raw = path.read_bytes()
        # The long runs' reports are kept gzipped in docs/ (every sample: megabytes).
        report = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
        png = path.parent / (path.name.removesuffix(".gz").removesuffix(".json") + ".png")
        if "soak" in report:
            from bench.steady.soak_charts import soak_chart

            soak_chart(report, png)
        else:
            slowdb_chart(report, png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
