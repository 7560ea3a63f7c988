"""Charts for docs/bench/gpu.md from the JSON that bench/gpu/ceiling.py writes.

.venv/bin/python bench/gpu/plot.py bench/gpu/results/h200_run5.json --out docs/bench
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def ceiling_charts(d: dict[str, Any], out: Path) -> None:
    rows = d["ceiling"]["fp16"]
    seqs = sorted({r["seq"] for r in rows})
    gpu = d["env"]["gpu"]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for s in seqs:
        pts = sorted((r["batch"], r["graph_ms"]) for r in rows if r["seq"] == s)
        ax.plot(*zip(*pts, strict=True), marker="o", ms=3, label=f"{s} tokens (graph replay)")
    eager = sorted((r["batch"], r["eager_ms"]) for r in rows if r["seq"] == 64)
    ax.plot(*zip(*eager, strict=True), ls="--", c="gray", label="64 tokens, eager launches")
    hf = sorted((r["batch"], r["eager_ms"]) for r in d["ceiling"].get("hf_fp16", []))
    if hf:
        ax.plot(
            *zip(*hf, strict=True),
            ls=":",
            c="black",
            label="64 tokens, transformers BertModel eager",
        )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="batch size (inputs)",
        ylabel="ms per forward",
        title=f"all-MiniLM-L6-v2 fp16 forward on {gpu}: flat until ~64-256 inputs",
    )
    ax.set_xticks([1, 4, 16, 64, 256, 1024], labels=["1", "4", "16", "64", "256", "1024"])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "gpu_ceiling_ms.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for s in seqs:
        pts = sorted((r["batch"], r["items_s"]) for r in rows if r["seq"] == s)
        ax.plot(*zip(*pts, strict=True), marker="o", ms=3, label=f"{s} tokens")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="batch size (inputs)",
        ylabel="items/s",
        title=f"Raw ceiling (best of eager/graph), {gpu}",
    )
    ax.set_xticks([1, 4, 16, 64, 256, 1024], labels=["1", "4", "16", "64", "256", "1024"])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "gpu_ceiling_items.png", dpi=120)
    plt.close(fig)


def predict_charts(d: dict[str, Any], out: Path) -> None:
    pred = d["predict"]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    ceil = sorted((r["batch"], r["items_s"]) for r in d["ceiling"]["at_mean_len"])
    mean = round(d["workload_mean_tokens"])
    ax.plot(
        *zip(*ceil, strict=True),
        c="black",
        lw=2,
        label=f"raw ceiling, uniform {mean} tokens, no padding",
    )
    for label, name in (
        ("pretokenized_array_out", "token ids in, float32 array out"),
        ("pretokenized", "token ids in, lists out"),
        ("text_array_out", "text in, float32 array out"),
        ("default", "predict(): text in, lists out"),
    ):
        pts = sorted((r["batch"], r["items_s"]) for r in pred if r["label"] == label)
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", ms=3, label=name)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="batch size (inputs, 8..128 tokens each)",
        ylabel="items/s",
        title=f"Worker predict path vs raw ceiling, {d['env']['gpu']}",
    )
    ax.set_xticks([1, 8, 64, 256, 1024], labels=["1", "8", "64", "256", "1024"])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "gpu_predict.png", dpi=120)
    plt.close(fig)

    rows = [r for r in pred if r["batch"] == 1024 and "gpu_ms" in r]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    labels = [r["label"] for r in rows]
    gpu_ms = [r["gpu_ms"] for r in rows]
    other = [r["wall_ms"] - r["gpu_ms"] for r in rows]
    ax.barh(labels, gpu_ms, label="GPU busy (forward + copies)")
    ax.barh(labels, other, left=gpu_ms, label="outside the GPU (tokenize, pack, lists, waits)")
    ideal = next(r["ms"] for r in d["ceiling"]["at_mean_len"] if r["batch"] == 1024)
    ax.axvline(ideal, c="black", ls="--", label=f"raw ceiling for 1024 inputs ({ideal:.1f} ms)")
    ax.invert_yaxis()
    ax.set(
        xlabel="ms per batch of 1024 mixed inputs (median)",
        title="Where a 1024-input batch spends its time",
    )
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "gpu_predict_breakdown.png", dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("--out", default="docs/bench")
    args = ap.parse_args()
    d = json.loads(Path(args.json).read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ceiling_charts(d, out)
    predict_charts(d, out)
    print("wrote", *sorted(p.name for p in out.glob("gpu_*.png")))


if __name__ == "__main__":
    main()
