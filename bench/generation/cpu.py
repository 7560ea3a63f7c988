"""Continuous batching against static batching and a plain per-request loop, on this
machine's CPU, with the same open-loop arrivals (Poisson, mixed prompt and output
lengths) at a sweep of rates; then throughput at equal p95 time to first token.

    flock /tmp/gristmill-heavy.lock python -m bench.generation.cpu --out docs/bench/generation

Writes ``cpu.json`` (the step-cost curve, every run's summary) and ``cpu.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

from bench.generation import plot, stepcost, workload
from bench.generation.servers import run_engine, run_plain
from scheduler.core.generation.config import PolicyConfig, kv_blocks_for_budget
from workers.models.causal_lm import weights
from workers.models.causal_lm.tokenizer import Codec

MODES = ("continuous", "static", "plain")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rates", default="1,2,4,6,8,12,16", help="requests per second")
    ap.add_argument("--seconds", type=float, default=20.0, help="of arrivals per rate")
    ap.add_argument("--min-requests", type=int, default=24)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--kv-mib", type=int, default=64, help="KV-cache budget, MiB")
    ap.add_argument("--step-tokens", type=int, default=256, help="token budget per step")
    ap.add_argument("--max-running", type=int, default=64)
    ap.add_argument("--ttft-slo", type=float, default=2.0, help="p95 TTFT target, seconds")
    ap.add_argument(
        "--give-up-ttft", type=float, default=20.0, help="stop a mode's sweep past this p95"
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads: one leaves the other core to the feeder (and, on a shared "
        "machine, to others: two threads stall whenever one is descheduled)",
    )
    ap.add_argument("--no-curve", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = weights.load("cpu", torch.float32)
    codec = Codec.load()
    blocks = kv_blocks_for_budget(args.kv_mib * 2**20, model.cfg.kv_bytes_per_token(4), 16)
    cfg = PolicyConfig(
        num_blocks=blocks,
        block_size=16,
        max_step_tokens=args.step_tokens,
        max_running=args.max_running,
        max_model_len=model.cfg.max_len,
    )
    out: dict[str, Any] = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "torch_threads": args.threads,
            "torch": torch.__version__,
        },
        "model": weights.manifest()["config"],
        "policy": cfg.model_dump(mode="json"),
        "workload": vars(workload.Mix()),
        "seconds_per_rate": args.seconds,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "runs": [],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.no_curve:
        out["step_cost"] = stepcost.curve(model, codec)
        print(json.dumps(out["step_cost"]), flush=True)
    rates = [float(r) for r in args.rates.split(",")]
    # Modes take turns at each rate, so a slow spell on the shared machine hits them alike.
    modes = args.modes.split(",")
    for rate in rates:
        n = max(args.min_requests, round(rate * args.seconds))
        arrivals = workload.requests(codec, n, rate)
        timeout = args.seconds * 4 + 60
        for mode in list(modes):
            res = (
                run_plain(model, arrivals, timeout)
                if mode == "plain"
                else run_engine(mode, model, codec, cfg, arrivals, timeout)
            )
            row = {"rate": rate, **res.summary()}
            out["runs"].append(row)
            print(json.dumps(row), flush=True)
            (args.out / "cpu.json").write_text(json.dumps(out, indent=1))
            p95 = row["ttft_p95_s"]
            if row["finished"] < row["requests"] or p95 is None or p95 > args.give_up_ttft:
                modes.remove(mode)  # past saturation: higher rates only queue longer
    # Throughput at equal p95 TTFT, for a few targets: the answer depends on the target.
    out["at_slo"] = [plot.at_slo(out["runs"], slo) for slo in (0.1, 0.25, 0.5, 1.0, 2.0)]
    out["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    (args.out / "cpu.json").write_text(json.dumps(out, indent=1))
    plot.chart(out, args.out / "cpu.png", args.ttft_slo)
    for row in out["at_slo"]:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
