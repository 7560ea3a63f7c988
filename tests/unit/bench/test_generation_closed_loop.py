"""The generation benchmark's closed loop: never more than ``concurrency`` requests in
flight, every request served, and on mixed output lengths static batching needs more
steps than continuous batching for the same work (it waits for each batch's longest)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from bench.generation import workload  # noqa: E402
from bench.generation.servers import run_engine  # noqa: E402
from scheduler.core.generation.config import PolicyConfig  # noqa: E402
from workers.models.causal_lm import weights  # noqa: E402
from workers.models.causal_lm.tokenizer import Codec  # noqa: E402

MIX = workload.Mix(prompt_min=8, prompt_max=24, short_out=(2, 4), long_out=(24, 32))


def test_closed_loop_keeps_concurrency_and_static_takes_more_steps() -> None:
    torch.set_num_threads(1)
    model = weights.load("cpu", torch.float32)
    codec = Codec.load()
    cfg = PolicyConfig(
        num_blocks=256, block_size=16, max_step_tokens=128, max_running=4, max_model_len=512
    )
    arrivals = workload.requests(codec, 12, rate=1.0, seed=5, mix=MIX, at_once=True)
    want = sum(r.max_tokens for _, r in arrivals)
    steps = {}
    for mode in ("continuous", "static"):
        res = run_engine(mode, model, codec, cfg, arrivals, 120, concurrency=4)
        s = res.summary()
        assert s["finished"] == 12 and s["output_tokens"] == want
        # In flight at any instant (arrival to finish) never exceeds the concurrency.
        edges = sorted(
            [(t.arrived, 1) for t in res.timings.values()]
            + [(t.done, -1) for t in res.timings.values() if t.done is not None]
        )
        live = peak = 0
        for _, d in edges:
            live += d
            peak = max(peak, live)
        assert peak <= 4
        steps[mode] = s["steps"]
    assert steps["static"] > steps["continuous"]
