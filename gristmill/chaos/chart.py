"""Recovery times of a chaos run, charted: one column of points per fault kind (each
fault a point), the time until every loaded partition and every API served again.
For a freeze or a cut the time runs from the SIGSTOP (the cut), so it holds the pause
itself; the chart also marks what the recovery took after the SIGCONT (the heal): 0
where the others served every partition and API while it was out.

    python -m gristmill.chaos.chart .gristmill/chaos/<run>/faults.json   # redraw

Needs matplotlib (the dev extra); without it a run skips its chart.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

_PAUSE = re.compile(r"(?:SIGSTOP|cut from \S+) ([\d.]+) s")


def pause_s(detail: str) -> float:
    """How long a freeze or a cut lasted, from its fault's detail; 0 for a kill. Pure."""
    m = _PAUSE.search(detail)
    return float(m[1]) if m else 0.0


def recovery_chart(faults: list[dict[str, Any]], path: Path) -> bool:
    """Draw ``faults`` (Fault records as dicts) to ``path``; False without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({f["kind"] for f in faults})
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(kinds)), 4.5))
    for x, kind in enumerate(kinds):
        mine = [f for f in faults if f["kind"] == kind]
        for j, f in enumerate(mine):
            jitter = (j - (len(mine) - 1) / 2) * 0.06
            rec = f.get("partitions_s"), f.get("apis_s")
            if None in rec:
                ax.scatter(x + jitter, 0, marker="x", color="tab:red")  # never recovered
                continue
            total = max(r for r in rec if r is not None)
            pause = pause_s(f.get("detail", ""))
            ax.scatter(x + jitter, total, color="tab:blue", s=14)
            if pause:  # 0: the others served on while it was frozen or cut off
                after = max(0.0, total - pause)
                ax.scatter(x + jitter, after, color="tab:orange", s=10, marker="v")
    ax.scatter([], [], color="tab:blue", s=14, label="recovery from the fault")
    ax.scatter(
        [], [], color="tab:orange", s=10, marker="v", label="freeze / cut: after SIGCONT / heal"
    )
    ax.set_xticks(range(len(kinds)), kinds, rotation=30, ha="right")
    ax.set(ylabel="seconds until every partition and API served again")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"chaos: {len(faults)} faults")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    src = Path(args[0])
    out = Path(args[1]) if len(args) > 1 else src.with_name("recovery.png")
    if not recovery_chart(json.loads(src.read_text()), out):
        print("matplotlib is not installed (the dev extra)", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
