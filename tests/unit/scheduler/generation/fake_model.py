"""A stand-in for the model in tests of the pure policy: a runner that keeps a real
paged cache of token ids (one slot per position, addressed through the plan's block
tables) and picks the next token as a fixed function of the context it reads back.

So a plan that gave two live sequences the same block, lost a token, or resumed
from the wrong position changes the text, and the tests see it. Vocabulary: id 0 is
end-of-text, ids 1..26 decode to 'a'..'z'.
"""

from __future__ import annotations

from collections.abc import Sequence

from core.generation import SampleSpec, StepOutput, StepPlan

EOS = 0
VOCAB = 27


def decode(ids: Sequence[int]) -> str:
    return "".join(chr(ord("a") + i - 1) for i in ids if i != EOS)


def encode(text: str) -> tuple[int, ...]:
    return tuple(ord(c) - ord("a") + 1 for c in text)


def next_token(context: Sequence[int], spec: SampleSpec, eos_every: int = 0) -> int:
    """Deterministic in the context (greedy) or in (seed, index) (sampled)."""
    h = 7
    for i, t in enumerate(context):
        h = (h * 31 + (i + 1) * t) % 1_000_003
    if spec.temperature > 0:
        h = (h + spec.seed * 7919 + spec.index * 104_729) % 1_000_003
    if eos_every and h % eos_every == 0:
        return EOS
    return 1 + h % (VOCAB - 1)


class FakeRunner:
    def __init__(self, num_blocks: int, block_size: int, eos_every: int = 0):
        self.slots: list[int | None] = [None] * (num_blocks * block_size)
        self.bs = block_size
        self.eos_every = eos_every
        self.plans: list[StepPlan] = []

    def _slot(self, blocks: Sequence[int], pos: int) -> int:
        return blocks[pos // self.bs] * self.bs + pos % self.bs

    def execute(self, plan: StepPlan) -> StepOutput:
        self.plans.append(plan)
        sampled: dict[str, int] = {}
        for c in plan.chunks:
            for i, t in enumerate(c.tokens):
                self.slots[self._slot(c.blocks, c.start + i)] = t
        for c in plan.chunks:  # read after all writes, as attention does
            if c.sample is None:
                continue
            ctx = [self.slots[self._slot(c.blocks, p)] for p in range(c.start + len(c.tokens))]
            assert None not in ctx, f"{c.seq_id} reads a slot never written"
            sampled[c.seq_id] = next_token(
                [t for t in ctx if t is not None], c.sample, self.eos_every
            )
        return StepOutput(plan.step, sampled)


def reference(
    prompt: Sequence[int],
    max_tokens: int,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    eos_every: int = 0,
    max_len: int = 10**9,
) -> list[int]:
    """What one sequence generates alone (stop strings aside)."""
    ctx = list(prompt)
    out: list[int] = []
    while len(out) < max_tokens and len(ctx) < max_len:
        t = next_token(ctx, SampleSpec(temperature, seed, len(out)), eos_every)
        if t == EOS:
            break
        out.append(t)
        ctx.append(t)
    return out
