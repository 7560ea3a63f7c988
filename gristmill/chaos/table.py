"""The run's summary table, one line per fault kind (requests are attributed to the
last fault injected before they were sent; "none" is the calm warm-up).

sent / accepted: sync requests sent and answered 200 or 504; job items: items of
jobs answered 202; persisted: accepted requests and job items found exactly once
with the right output; refused→row: answered 503 or cut off, yet processed.
"""

from __future__ import annotations

import statistics

from gristmill.chaos.audit import AuditResult, Tally
from gristmill.chaos.faults import Fault

COLUMNS = (
    ("fault", 16),
    ("n", 3),
    ("sent", 6),
    ("accepted", 8),
    ("job items", 9),
    ("persisted", 9),
    ("lost", 4),
    ("dup", 3),
    ("wrong", 5),
    ("503", 5),
    ("504", 4),
    ("conn", 4),
    ("refused→row", 11),
    ("recovery s med/max", 18),
    ("back s med/max", 14),
)


def _span(values: list[float | None]) -> str:
    xs = [v for v in values if v is not None]
    missing = len(values) - len(xs)
    if not xs:
        return "-" if not missing else f"{missing} never"
    text = f"{statistics.median(xs):.1f} / {max(xs):.1f}"
    return text + (f" ({missing} never)" if missing else "")


def _row(name: str, faults: list[Fault], t: Tally) -> list[str]:
    return [
        name,
        str(len(faults)) if name not in ("none", "total") else "-",
        str(t.sent),
        str(t.accepted),
        str(t.job_items),
        str(t.persisted + t.job_items_persisted),
        str(t.lost),
        str(t.duplicated),
        str(t.wrong),
        str(t.s503),
        str(t.s504),
        str(t.conn),
        str(t.refused_persisted),
        _span([f.recovery_s for f in faults]) if faults else "-",
        _span([f.back_s for f in faults]) if faults else "-",
    ]


def render(faults: list[Fault], result: AuditResult) -> str:
    kinds = sorted(result.by_kind, key=lambda k: (k != "none", k))
    lines = [[name for name, _ in COLUMNS]]
    for kind in kinds:
        lines.append(_row(kind, [f for f in faults if f.kind == kind], result.by_kind[kind]))
    total = _row("total", faults, result.total)
    total[1] = str(len(faults))
    lines.append(total)
    widths = [max(w, *(len(line[i]) for line in lines)) for i, (_, w) in enumerate(COLUMNS)]

    def fmt(cells: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [fmt(lines[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [fmt(line) for line in lines[1:]]
    return "\n".join(out)


def fault_lines(faults: list[Fault]) -> str:
    def s(v: float | None) -> str:
        return "never" if v is None else f"{v:.1f}"

    out = []
    for f in faults:
        out.append(
            f"round {f.round:>2} {f.kind:<9} {f.target:<16} recovery {s(f.recovery_s):>5}s "
            f"(partitions {s(f.partitions_s)}, apis {s(f.apis_s)}), back {s(f.back_s)}s"
            + (f"  [{f.detail}]" if f.detail else "")
        )
    return "\n".join(out)
