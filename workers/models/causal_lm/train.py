"""Train the causal LM on the shipped corpus and write its weights and tokenizer.

    python -m workers.models.causal_lm.train            # the shipped weights (minutes on 2 cores)
    python -m workers.models.causal_lm.train --steps 20 --out /tmp/lm   # a quick check

Deterministic for a given torch version and CPU (seeded, fixed thread count); other
machines give close but not bit-identical floats, which is why the result ships.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from workers.models.causal_lm import weights
from workers.models.causal_lm.config import LMConfig
from workers.models.causal_lm.corpus import CORPUS_PATH, END_OF_TEXT
from workers.models.causal_lm.model import CausalLM
from workers.models.causal_lm.tokenizer import TOKENIZER_PATH, Codec, train_tokenizer

SEED = 17


def corpus_ids(codec: Codec, text: str) -> torch.Tensor:
    ids: list[int] = []
    for doc in text.split(END_OF_TEXT):
        if doc:
            ids.extend(codec.encode(doc))
            ids.append(codec.eos_id)
    return torch.tensor(ids, dtype=torch.long)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


@torch.no_grad()
def eval_loss(model: CausalLM, data: torch.Tensor, ctx: int) -> float:
    model.eval()
    n = (len(data) - 1) // ctx
    x = data[: n * ctx].view(n, ctx)
    y = data[1 : n * ctx + 1].view(n, ctx)
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    model.train()
    return float(loss)


def train(
    cfg: LMConfig,
    steps: int,
    batch: int,
    ctx: int,
    lr: float,
    threads: int,
    log_every: int = 50,
    bf16: bool = True,
) -> tuple[CausalLM, Codec, dict[str, Any]]:
    torch.manual_seed(SEED)
    torch.set_num_threads(threads)
    text = CORPUS_PATH.read_text(encoding="utf-8")
    codec = Codec(train_tokenizer(text, cfg.vocab_size))
    data = corpus_ids(codec, text)
    split = int(len(data) * 0.95)  # the last 5% is held out, to see over-fitting
    train_ids, val_ids = data[:split], data[split:]
    model = CausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(SEED)
    started = time.perf_counter()
    model.train()
    for step in range(steps):
        starts = torch.randint(0, len(train_ids) - ctx - 1, (batch,), generator=gen)
        x = torch.stack([train_ids[s : s + ctx] for s in starts.tolist()])
        y = torch.stack([train_ids[s + 1 : s + ctx + 1] for s in starts.tolist()])
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup=max(1, steps // 20))
        # bf16 matmuls (weights and optimizer stay fp32): 1.6x the tokens/s of fp32 on
        # a CPU with AVX512-BF16, measured on the training shape.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:5d}  loss {loss.item():.3f}  {time.perf_counter() - started:6.0f} s")
    record = {
        "steps": steps,
        "batch": batch,
        "context": ctx,
        "lr": lr,
        "seed": SEED,
        "threads": threads,
        "bf16": bf16,
        "seconds": round(time.perf_counter() - started, 1),
        "corpus_tokens": len(data),
        "train_loss": round(float(loss.item()), 4),
        "val_loss": round(eval_loss(model, val_ids, ctx), 4),
        "torch": torch.__version__,
    }
    return model.eval(), codec, record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=512, help="training window, tokens (max_len)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=LMConfig.d_model)
    ap.add_argument("--layers", type=int, default=LMConfig.n_layer)
    ap.add_argument("--heads", type=int, default=LMConfig.n_head)
    ap.add_argument("--kv-heads", type=int, default=LMConfig.n_kv_head)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--no-bf16", action="store_true", help="fp32 matmuls (CPUs without bf16)")
    ap.add_argument("--out", type=Path, default=None, help="folder (default: the shipped data)")
    args = ap.parse_args()
    cfg = LMConfig(
        d_model=args.d_model,
        n_layer=args.layers,
        n_head=args.heads,
        n_kv_head=args.kv_heads,
        d_ff=4 * args.d_model,
    )
    model, codec, record = train(
        cfg,
        args.steps,
        args.batch,
        args.ctx,
        args.lr,
        args.threads,
        args.log_every,
        not args.no_bf16,
    )
    out = args.out or weights.WEIGHTS_PATH.parent
    out.mkdir(parents=True, exist_ok=True)
    codec.save(TOKENIZER_PATH if args.out is None else out / "tokenizer.json")
    weights.save(model, record, out / "weights.pt", out / "manifest.json")
    print(record)


if __name__ == "__main__":
    main()
