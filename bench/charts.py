"""Charts and the markdown table for a sweep (``bench.sweep`` writes the input JSON).

python -m bench.charts docs/bench/sweep.json      # redraw from saved numbers
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

COLORS = {"gristmill": "tab:blue", "ray": "tab:orange", "plain": "tab:green"}
BREAKDOWN = (
    ("queue_ms", "queue (API to scheduler)"),
    ("batch_wait_ms", "batch wait"),
    ("compute_ms", "compute"),
    ("persist_ms", "persist"),
    ("respond_ms", "respond (NOTIFY to answer)"),
    ("client_http_ms", "HTTP + client"),
)


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _by_system(out: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    rows: dict[str, list[dict[str, Any]]] = {}
    for r in out["runs"]:
        if "skipped" not in r:
            rows.setdefault(r["system"], []).append(r)
    return rows


def _rate_ticks(ax: Any, out: dict[str, Any]) -> None:
    rates = sorted({r["offered_rps"] for r in out["runs"] if "skipped" not in r})
    ax.set_xscale("log")
    # Thousands as "1k", "1.5k": neighbours on a log axis (1500, 2000) stay readable.
    ax.set_xticks(rates, [f"{r / 1000:g}k" if r >= 1000 else f"{r:g}" for r in rates])
    ax.minorticks_off()


def latency_chart(out: dict[str, Any], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    for system, rows in _by_system(out).items():
        xs = [r["offered_rps"] for r in rows]
        for key, style in (("p50_ms", ":"), ("p95_ms", "--"), ("p99_ms", "-")):
            ys = [r[key] if r[key] is not None else float("nan") for r in rows]
            label = f"{system} {key[:-3]}"
            ax.plot(xs, ys, style, marker="o", ms=3, color=COLORS.get(system), label=label)
    ax.axhline(500, color="grey", lw=0.8)
    ax.text(ax.get_xlim()[0], 520, " 500 ms", color="grey", fontsize=8)
    ax.set(xscale="log", yscale="log", xlabel="offered load (req/s)")
    ax.set(ylabel="latency of 200 answers from intended send (ms)")
    _rate_ticks(ax, out)
    ax.set_title("Latency percentiles vs offered load (sim, 2 workers, 100 ms/batch)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def throughput_chart(out: dict[str, Any], path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    top, low = 1.0, float("inf")
    for system, rows in _by_system(out).items():
        xs = [r["offered_rps"] for r in rows]
        top, low = max(top, *xs), min(low, *xs)
        ax.plot(xs, [r["achieved_rps"] for r in rows], "-o", ms=3, color=COLORS.get(system))
        ax.lines[-1].set_label(f"{system} (200 answers/s)")
    low = min(low, top)
    ax.plot([low, top], [low, top], color="grey", lw=0.8, label="offered")
    ax.set(xscale="log", yscale="log", xlabel="offered load (req/s)", ylabel="achieved (req/s)")
    _rate_ticks(ax, out)
    ax.set_title("Throughput vs offered load")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def breakdown_chart(out: dict[str, Any], path: Path) -> None:
    plt = _plt()
    rows = [r for r in _by_system(out).get("gristmill", []) if r.get("stages_ms")]
    fig, (ax, share) = plt.subplots(1, 2, figsize=(12, 5))
    labels = [f"{r['offered_rps']:g}" for r in rows]
    means = {
        key: [max(0.0, r["stages_ms"].get(key, {}).get("mean", 0.0)) for r in rows]
        for key, _ in BREAKDOWN
    }
    totals = [sum(v[i] for v in means.values()) or 1.0 for i in range(len(rows))]
    bottom = [0.0] * len(rows)
    low = [0.0] * len(rows)
    for key, label in BREAKDOWN:
        vals = means[key]
        pct = [100 * v / t for v, t in zip(vals, totals, strict=True)]
        ax.bar(labels, vals, bottom=bottom, label=label)
        share.bar(labels, pct, bottom=low, label=label)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        low = [b + v for b, v in zip(low, pct, strict=True)]
    ax.set(xlabel="offered load (req/s)", ylabel="mean ms per 200 answer (stacked)")
    ax.set_title("Gristmill: mean time per stage")
    share.set(xlabel="offered load (req/s)", ylabel="% of the mean latency")
    share.set_title("Gristmill: share of each stage")
    for a in (ax, share):
        a.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_all(out: dict[str, Any], folder: Path) -> list[Path]:
    paths = [folder / "latency.png", folder / "throughput.png", folder / "breakdown.png"]
    for draw, p in zip((latency_chart, throughput_chart, breakdown_chart), paths, strict=True):
        draw(out, p)
    return paths


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{v:g}" if isinstance(v, float | int) else str(v)


def table(out: dict[str, Any]) -> str:
    head = (
        "| system | offered | achieved | p50 | p95 | p99 | max | non-200 | batch | fill "
        "| busy | server CPU | client CPU | load1 |"
    )
    lines = [head, "|" + "---|" * 14]
    for r in out["runs"]:
        if "skipped" in r:
            lines.append(f"| {r['system']} | {r['offered_rps']:g} | {r['skipped']} |" + " |" * 11)
            continue
        bad = {k: v for k, v in r["statuses"].items() if k != "200"}
        cells = [
            r["system"], r["offered_rps"], r["achieved_rps"], r["p50_ms"], r["p95_ms"],
            r["p99_ms"], r["max_ms"], " ".join(f"{k}:{v}" for k, v in bad.items()) or "0",
            r["mean_batch_size"], r["batch_fill"], r["busy_fraction"], r["server_cpu_cores"],
            r["client_cpu_cores"], r["load1_before"],
        ]  # fmt: skip
        lines.append("| " + " | ".join(_fmt(c) for c in cells) + " |")
    cc = out.get("crosscheck")
    if cc:
        lines += [
            "",
            f"Cross-check on {cc['system']}: both tools at once, "
            f"{cc.get('total_rps', 0):g} req/s in all:",
            "",
        ]
        lines += ["| tool | offered | achieved | p50 | p95 | p99 | max | statuses |"]
        lines += ["|" + "---|" * 8]
        ours, theirs = cc["ours"], cc["vegeta"]
        rows = [("ours, 200 answers", ours, "")]
        if "p50_all_ms" in ours:  # vegeta's percentiles cover every answer, errors too
            rows.append(("ours, all answers", ours, "_all"))
        rows.append(("vegeta, all answers", theirs, ""))
        for tool, r, sfx in rows:
            cells = [tool, r["offered_rps"], r["achieved_rps"], r[f"p50{sfx}_ms"]]
            cells += [r[f"p95{sfx}_ms"], r[f"p99{sfx}_ms"], r["max_ms"], r["statuses"]]
            lines.append("| " + " | ".join(_fmt(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    src = Path(sys.argv[1])
    data = json.loads(src.read_text())
    print(table(data))
    print(draw_all(data, src.parent))
