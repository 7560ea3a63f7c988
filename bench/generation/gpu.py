"""On a GPU: tokens/s of the continuous-batching decode loop against the same model
run one request at a time (a plain loop with a contiguous KV cache), and the mixed
workload of the CPU benchmark submitted at once (continuous, static, plain).

    python -m bench.generation.gpu --out DIR            # on the GPU machine
    python -m bench.generation.gpu --out DIR --device cpu --batches 1,8 --quick  # a dry run

Writes ``gpu.json`` and ``gpu.png``. The model is tiny (1.7M parameters), so a step
costs mostly kernel launches and Python: the numbers show what batching buys when a
step's fixed cost dominates, as it does for large models' decode steps on a GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from bench.generation import workload
from bench.generation.servers import run_engine, run_plain
from scheduler.core.generation.config import PolicyConfig, kv_blocks_for_budget
from scheduler.core.generation.engine import Engine
from scheduler.core.generation.policy import ContinuousBatcher
from scheduler.core.generation.sequence import GenRequest
from workers.models.causal_lm import weights
from workers.models.causal_lm.model import CausalLM
from workers.models.causal_lm.plain import generate
from workers.models.causal_lm.runner import ModelRunner
from workers.models.causal_lm.tokenizer import Codec


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode_loop(
    model: CausalLM,
    codec: Codec,
    cfg: PolicyConfig,
    batch: int,
    prompt: int,
    new: int,
) -> dict[str, Any]:
    """``batch`` sequences at once through the engine: overall and steady-decode tokens/s."""
    text_ids = codec.encode(workload.CORPUS_PATH.read_text()[:100_000])
    engine = Engine(
        ContinuousBatcher(cfg, codec.decode, codec.eos_id),
        ModelRunner(model, cfg.num_blocks, cfg.block_size),
    )
    for i in range(batch):
        start = (i * 997) % (len(text_ids) - prompt)
        engine.submit(
            GenRequest(f"b{i}", tuple(text_ids[start : start + prompt]), new, ignore_eos=True)
        )
    dev = next(model.parameters()).device
    _sync(dev)
    t0 = time.perf_counter()
    decode_steps: list[float] = []
    tokens = 0
    while engine.policy.has_work():
        t = time.perf_counter()
        engine.step()
        assert engine.last is not None
        tokens += engine.last.sampled
        if engine.last.tokens == engine.last.sequences == batch:  # a pure decode step
            decode_steps.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    step_s = statistics.median(decode_steps) if decode_steps else float("nan")
    return {
        "batch": batch,
        "output_tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "decode_step_ms_p50": round(1000 * step_s, 3),
        "decode_tokens_per_s": round(batch / step_s, 1),
    }


def plain_loop(model: CausalLM, codec: Codec, n: int, prompt: int, new: int) -> dict[str, Any]:
    text_ids = codec.encode(workload.CORPUS_PATH.read_text()[:100_000])
    dev = next(model.parameters()).device
    _sync(dev)
    t0 = time.perf_counter()
    tokens = 0
    for i in range(n):
        start = (i * 997) % (len(text_ids) - prompt)
        tokens += len(generate(model, text_ids[start : start + prompt], new))
    wall = time.perf_counter() - t0
    return {
        "requests": n,
        "output_tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
    }


def closed_loop(
    model: CausalLM, codec: Codec, cfg: PolicyConfig, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """``c`` streams kept in flight, ``requests_per_stream * c`` mixed requests in all,
    ``max_running`` = ``c``: static batching runs ``c`` at a time and waits for the
    longest; continuous batching refills a slot as soon as a sequence ends. (Submitted
    at once with ``max_running`` above their number, both form the one same batch.)"""
    rows = []
    for c in (int(x) for x in args.concurrency.split(",") if x):
        n = args.requests_per_stream * c
        arrivals = workload.requests(codec, n, rate=1.0, seed=3, at_once=True)
        ccfg = cfg.model_copy(update={"max_running": c})
        for mode in ("continuous", "static"):
            res = run_engine(mode, model, codec, ccfg, arrivals, 600, concurrency=c)
            rows.append({"concurrency": c, **res.summary()})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def chart(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = out["decode_loop"]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ax.plot(
        [r["batch"] for r in rows],
        [r["decode_tokens_per_s"] for r in rows],
        "o-",
        label="continuous batching, steady decode",
    )
    ax.plot(
        [r["batch"] for r in rows],
        [r["tokens_per_s"] for r in rows],
        "s--",
        label="continuous batching, prefill included",
    )
    ax.axhline(
        out["plain_loop"]["tokens_per_s"], color="tab:green", ls=":", label="plain per-request loop"
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequences decoding together")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"{out['device']} ({out['dtype']}): decode loop vs plain loop", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--batches", default="1,4,16,64,128,256,512")
    ap.add_argument("--prompt", type=int, default=128, help="tokens per prompt")
    ap.add_argument("--new", type=int, default=256, help="tokens generated per sequence")
    ap.add_argument("--plain-requests", type=int, default=8)
    ap.add_argument("--mixed", type=int, default=256, help="requests of the mixed workload")
    ap.add_argument("--kv-gib", type=float, default=4.0)
    ap.add_argument("--concurrency", default="64,256", help="closed-loop streams, each a run")
    ap.add_argument("--requests-per-stream", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="small sizes (a dry run)")
    args = ap.parse_args()
    if args.quick:
        args.new, args.plain_requests, args.mixed = 16, 2, 8
        args.concurrency, args.requests_per_stream = "4", 2
    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    model = weights.load(dev, dtype)
    codec = Codec.load()
    batches = [int(b) for b in args.batches.split(",")]
    per_token = model.cfg.kv_bytes_per_token(torch.finfo(dtype).bits // 8)
    cfg = PolicyConfig(
        num_blocks=kv_blocks_for_budget(int(args.kv_gib * 2**30), per_token, 16),
        block_size=16,
        max_step_tokens=max(2048, max(batches)),
        max_running=max(batches),
        max_model_len=model.cfg.max_len,
    )
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor()
    out: dict[str, Any] = {
        "device": name,
        "dtype": args.dtype,
        "torch": torch.__version__,
        "model": weights.manifest()["config"],
        "policy": cfg.model_dump(mode="json"),
        "prompt_tokens": args.prompt,
        "new_tokens": args.new,
    }
    decode_loop(model, codec, cfg, 4, args.prompt, 8)  # warm-up: kernels, allocator
    out["plain_loop"] = plain_loop(model, codec, args.plain_requests, args.prompt, args.new)
    print(json.dumps(out["plain_loop"]), flush=True)
    out["decode_loop"] = []
    for b in batches:
        row = decode_loop(model, codec, cfg, b, args.prompt, args.new)
        row["speedup_vs_plain"] = round(row["tokens_per_s"] / out["plain_loop"]["tokens_per_s"], 1)
        out["decode_loop"].append(row)
        print(json.dumps(row), flush=True)
    arrivals = workload.requests(codec, args.mixed, rate=1.0, seed=2, at_once=True)
    mixed = []
    # cuDNN attention (PyTorch's own pick on Hopper) against the kernels serving uses
    # (model.serving_attention): the 2026-11 runs' 84 ms steps, same work, same call.
    for cudnn in (True, False):
        for mode in ("continuous", "static"):
            res = run_engine(mode, model, codec, cfg, arrivals, 600, cudnn_attention=cudnn)
            mixed.append({"mode": mode, "cudnn_attention": cudnn, **res.summary()})
            print(json.dumps(mixed[-1]), flush=True)
    n_plain = min(len(arrivals), max(4, args.mixed // 16))
    mixed.append(
        {
            "mode": "plain",
            "note": f"first {n_plain} requests only",
            **run_plain(model, arrivals[:n_plain], 600).summary(),
        }
    )
    print(json.dumps(mixed[-1]), flush=True)
    out["mixed_at_once"] = mixed
    out["closed_loop"] = closed_loop(model, codec, cfg, args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu.json").write_text(json.dumps(out, indent=1))
    chart(out, args.out / "gpu.png")


if __name__ == "__main__":
    main()
