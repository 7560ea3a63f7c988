"""The CPU benchmark's chart and its "throughput at equal p95 TTFT" table.

python -m bench.generation.plot docs/bench/generation/cpu.json   # redraw
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

COLORS = {"continuous": "tab:blue", "static": "tab:orange", "plain": "tab:green"}


def at_slo(runs: list[dict[str, Any]], slo_s: float) -> dict[str, Any]:
    """Per mode: the highest measured throughput whose p95 TTFT met ``slo_s``."""
    best: dict[str, Any] = {}
    for r in runs:
        p95 = r.get("ttft_p95_s")
        if p95 is None or p95 > slo_s or r["finished"] < r["requests"]:
            continue
        if r["mode"] not in best or r["tokens_per_s"] > best[r["mode"]]["tokens_per_s"]:
            best[r["mode"]] = {k: r[k] for k in ("rate", "tokens_per_s", "ttft_p95_s")}
    return {"slo_p95_ttft_s": slo_s, "best": best}


def chart(out: dict[str, Any], path: Path, slo_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode, color in COLORS.items():
        rows = [r for r in out["runs"] if r["mode"] == mode and r["ttft_p95_s"] is not None]
        if not rows:
            continue
        ax1.plot(
            [r["tokens_per_s"] for r in rows],
            [r["ttft_p95_s"] for r in rows],
            "o-",
            color=color,
            label=mode,
        )
        ax2.plot(
            [r["rate"] for r in rows],
            [r["tokens_per_s"] for r in rows],
            "o-",
            color=color,
            label=mode,
        )
    ax1.axhline(slo_s, color="grey", ls="--", lw=1)
    ax1.set_yscale("log")
    ax1.set_xlabel("output tokens/s (measured)")
    ax1.set_ylabel("p95 time to first token, s (log)")
    ax1.set_title(f"throughput at equal p95 TTFT (dashed: {slo_s:g} s)")
    ax2.set_xlabel("offered requests/s (Poisson)")
    ax2.set_ylabel("output tokens/s")
    ax2.set_title("tokens/s against offered load")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    m = out["model"]
    fig.suptitle(
        f"causal LM d={m['d_model']} L={m['n_layer']}, {out['machine']['torch_threads']} torch "
        f"thread(s) on a {out['machine']['cores']}-core CPU; step budget "
        f"{out['policy']['max_step_tokens']} tokens",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    src = Path(sys.argv[1])
    data = json.loads(src.read_text())
    chart(data, src.with_suffix(".png"), float(sys.argv[2]) if len(sys.argv) > 2 else 2.0)
    for slo in (0.1, 0.25, 0.5, 1.0, 2.0):
        print(json.dumps(at_slo(data["runs"], slo)))
