"""The host's share of a generation step: the policy (schedule, update, detokenize)
and the runner's plan -> tensors work (``PagedStep``), with no model in the step.

    python -m bench.generation.hostcost --concurrency 64,256 [--device cuda]

Each run keeps ``c`` mixed requests running (``4 * c`` in all, the workload of
bench/generation/workload.py) on a runner that builds the step's tensors on
``--device`` and samples a fixed token. Milliseconds per step against the model's own
step time (bench/generation/stepcost.py, gpu.py's decode loop) says which one bounds
tokens/s: host time grows with the batch, so where it dominates, a step costs about
the same per sequence whatever the batching, and continuous batching's fewer steps
buy little.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from bench.generation import workload
from core.generation import StepOutput, StepPlan
from scheduler.core.generation.config import PolicyConfig
from scheduler.core.generation.engine import Engine
from scheduler.core.generation.policy import ContinuousBatcher
from workers.models.causal_lm.config import LMConfig
from workers.models.causal_lm.paged import KVPool, PagedStep
from workers.models.causal_lm.tokenizer import Codec


class HostOnlyRunner:
    """The runner's host work (the step's tensors on the device), no forward pass."""

    def __init__(self, cfg: LMConfig, num_blocks: int, block_size: int, device: torch.device):
        self.pool = KVPool(cfg, num_blocks, block_size, device, torch.float32)
        self.device = device
        self.token = 5

    def execute(self, plan: StepPlan) -> StepOutput:
        PagedStep(self.pool, plan.chunks, self.device)
        sampled = {c.seq_id: self.token for c in plan.chunks if c.sample is not None}
        return StepOutput(plan.step, sampled, 0.0)


def host_ms(codec: Codec, c: int, device: torch.device) -> dict[str, float]:
    lm = LMConfig()
    cfg = PolicyConfig(
        num_blocks=8192, block_size=16, max_step_tokens=2048, max_running=c, max_model_len=512
    )
    engine = Engine(
        ContinuousBatcher(cfg, codec.decode, codec.eos_id),
        HostOnlyRunner(lm, cfg.num_blocks, cfg.block_size, device),
    )
    for _, req in workload.requests(codec, 4 * c, rate=1.0, seed=3, at_once=True):
        engine.submit(req)
    steps = seqs = 0
    t0 = time.perf_counter()
    while engine.policy.has_work():
        engine.step()
        assert engine.last is not None
        steps += 1
        seqs += engine.last.sequences
    wall = time.perf_counter() - t0
    return {
        "concurrency": c,
        "steps": steps,
        "mean_batch": round(seqs / steps, 1),
        "host_ms_per_step": round(1000 * wall / steps, 2),
        "host_us_per_sequence_step": round(1e6 * wall / seqs, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--concurrency", default="64,256")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    codec = Codec.load()
    for c in (int(x) for x in args.concurrency.split(",")):
        print(json.dumps(host_ms(codec, c, torch.device(args.device))), flush=True)


if __name__ == "__main__":
    main()
