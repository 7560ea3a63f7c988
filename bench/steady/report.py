"""Per-minute tables of a long run's traffic, and the check that decides its exit status.
Pure: from ``Traffic`` (bench/steady/traffic.py) to plain dicts."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.steady.traffic import Traffic, pct_ms


def lost(counts: Counter[str]) -> int:
    """Sync requests not answered 200: refused, given up on, never answered."""
    return sum(n for k, n in counts.items() if k != "200")


def minute_rows(traffic: Traffic, minute_s: float = 60.0) -> list[dict[str, Any]]:
    """One row per minute of the schedule: what was offered, answered, refused (by
    reason) and given up on, and the 200s' latency percentiles."""
    rows = []
    t = 0.0
    while t < traffic.spec.duration_s:
        end = min(t + minute_s, traffic.spec.duration_s)
        c = traffic.window(t, end)
        h = traffic.latency(t, end)
        rows.append(
            {
                "minute": int(t // minute_s) + 1,
                "offered": sum(c.values()),
                "ok": c.get("200", 0),
                "lost": lost(c),
                "outcomes": dict(sorted(c.items())),
                "p50_ms": pct_ms(h, 50),
                "p95_ms": pct_ms(h, 95),
                "p99_ms": pct_ms(h, 99),
            }
        )
        t = end
    return rows


def window_rows(traffic: Traffic) -> list[dict[str, Any]]:
    """Latency percentiles of the 200s per histogram window (``hist_s``)."""
    step = traffic.spec.hist_s
    out = []
    for i, h in enumerate(traffic.hists):
        out.append(
            {
                "t0": i * step,
                "seconds": step,
                "ok": h.get_total_count(),
                "p50_ms": pct_ms(h, 50),
                "p95_ms": pct_ms(h, 95),
                "p99_ms": pct_ms(h, 99),
            }
        )
    return out


def table(rows: list[dict[str, Any]]) -> str:
    """The per-minute rows as a markdown table (refusals folded into one column)."""
    lines = [
        "| minute | offered | 200 | lost | p50 ms | p95 ms | p99 ms | not 200 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        other = ", ".join(f"{k}: {n}" for k, n in r["outcomes"].items() if k != "200") or "-"
        lines.append(
            f"| {r['minute']} | {r['offered']} | {r['ok']} | {r['lost']} | {r['p50_ms']} | "
            f"{r['p95_ms']} | {r['p99_ms']} | {other} |"
        )
    return "\n".join(lines)


def save(
    report: dict[str, Any],
    out: Path,
    name: str,
    chart: Callable[[dict[str, Any], Path], None],
) -> Path:
    """Print the per-minute table; write ``<name>-<stamp>.json`` and its chart (.png)."""
    print(table(report["minutes_table"]))
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(report["start_wall"]))
    path = out / f"{name}-{stamp}.json"
    path.write_text(json.dumps(report, indent=1, default=str))
    chart(report, path.with_suffix(".png"))
    return path
