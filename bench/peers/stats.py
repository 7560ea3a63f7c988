"""Batch counters every peer worker process keeps, so the sweep can compute batch fill and
worker busy fraction the same way for each system (Gristmill's come from PostgreSQL).

Each process rewrites ``<dir>/<pid>.json`` after every batch (at most ~10 per second per
worker with ``sim``), atomically, so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

STATS_DIR_ENV = "GM_BENCH_STATS_DIR"


@dataclass
class BatchTotals:
    batches: int = 0
    items: int = 0
    busy_s: float = 0.0

    def __sub__(self, other: BatchTotals) -> BatchTotals:
        return BatchTotals(
            self.batches - other.batches, self.items - other.items, self.busy_s - other.busy_s
        )


class BusyMeter:
    def __init__(self, stats_dir: str | Path | None) -> None:
        self.totals = BatchTotals()
        self.path = Path(stats_dir) / f"{os.getpid()}.json" if stats_dir else None

    def record(self, items: int, busy_s: float) -> None:
        t = self.totals
        t.batches, t.items, t.busy_s = t.batches + 1, t.items + items, t.busy_s + busy_s
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps([t.batches, t.items, t.busy_s]))
        tmp.replace(self.path)


def read_totals(stats_dir: Path) -> BatchTotals:
    out = BatchTotals()
    for f in stats_dir.glob("*.json"):
        try:
            b, i, s = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        out.batches, out.items, out.busy_s = out.batches + b, out.items + i, out.busy_s + s
    return out
