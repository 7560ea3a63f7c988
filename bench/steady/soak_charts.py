"""The soak's chart (bench/steady/soak.py): latency and outcomes over the run, resident
memory of every process, PostgreSQL's sizes, Kafka's lag.

    python -m bench.steady.charts bench-out/soak-<stamp>.json   # redraw from a report
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.steady.charts import _latency, _plt, finish


def _kind(label: str) -> str:
    """A process's kind for the chart: its root, or the root's children as a group."""
    root, _, child = label.partition("/")
    if not child:
        return root
    return {"api": "API processes", "scheduler": "workers", "postgres": "PostgreSQL backends"}.get(
        root, f"{root} children"
    )


def _rss(ax: Any, report: dict[str, Any]) -> None:
    start = report["start_wall"]
    res = report["resources"]
    kinds = sorted({_kind(p) for s in res for p in s["processes"]})
    xs = [s["t"] - start for s in res]
    for kind in kinds:
        ys = [
            sum(
                v.get("uss_mb") or v["rss_mb"]
                for label, v in s["processes"].items()
                if _kind(label) == kind
            )
            for s in res
        ]
        ax.plot(xs, ys, lw=0.9, label=kind)
    ax.set(ylabel="private memory, USS (MiB, summed by kind)", yscale="log")
    ax.legend(fontsize=7, ncol=3, loc="upper left")
    ax.grid(alpha=0.3)


def _sizes(ax: Any, report: dict[str, Any]) -> None:
    start = report["start_wall"]
    res = report["resources"]
    xs = [s["t"] - start for s in res]
    for name in ("requests", "batches", "job_items"):
        ax.plot(
            xs,
            [(s["tables"].get(name) or {}).get("table_mb", 0) for s in res],
            label=f"{name} table",
        )
        ax.plot(
            xs,
            [(s["tables"].get(name) or {}).get("index_mb", 0) for s in res],
            ls="--",
            label=f"{name} indexes",
        )
    logs = {"requests", "batches", "job_items", "refusals", "answer_timeouts"}
    other = [
        sum(t["table_mb"] + t["index_mb"] for n, t in s["tables"].items() if n not in logs)
        for s in res
    ]
    ax.plot(xs, other, color="black", label="every other table")
    ax.set(ylabel="PostgreSQL (MiB)")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)


def _lag(ax: Any, report: dict[str, Any]) -> None:
    start = report["start_wall"]
    res = [s for s in report["resources"] if s.get("lag")]
    for topic in sorted({k for s in res for k in s["lag"]}):
        ax.plot([s["t"] - start for s in res], [s["lag"].get(topic, 0) for s in res], label=topic)
    for j in report.get("jobs", []):
        ax.axvline(j["submitted_at"] - start, color="grey", lw=0.6, ls=":")
    ax.set(ylabel="Kafka lag (messages)", xlabel="second of the run", yscale="symlog")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def soak_chart(report: dict[str, Any], path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(4, 1, figsize=(11, 13), sharex=True)
    _latency(axes[0], report)
    _rss(axes[1], report)
    _sizes(axes[2], report)
    _lag(axes[3], report)
    verdicts = ", ".join(
        f"{k} {'ok' if v['ok'] else 'FAILED'}" for k, v in report.get("checks", {}).items()
    )
    finish(
        fig,
        path,
        f"soak: {report['rate']:g} sync req/s for {report['minutes']:g} min, a "
        f"{report['job_items']:,}-item job every {report['job_every_s']:g} s (dotted)\n{verdicts}",
    )
