"""The wire types of one generation step, between the continuous-batching policy
(scheduler/core/generation/) and the process that runs the model (workers/models/causal_lm/).

A ``StepPlan`` says, for each sequence in this step, which tokens to compute, at which
positions, into which KV-cache blocks, and whether to sample the next token after
them. It carries everything the runner needs, so the runner keeps no per-sequence
state besides the KV pool itself: a lost plan or a restarted policy costs only a
recompute. A ``StepOutput`` gives back the sampled token of every chunk that asked.
Plain values only (ints, tuples, str), so a plan pickles cheaply over a socket.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SampleSpec:
    """How to pick the next token. ``temperature`` 0 is greedy (argmax). Otherwise the
    randomness comes from (``seed``, ``index``) alone, ``index`` being which output
    token this is (0 = the first), so a sequence recomputed after preemption, or run
    in another batch, draws the same token."""

    temperature: float = 0.0
    seed: int = 0
    index: int = 0


@dataclass(frozen=True, slots=True)
class Chunk:
    seq_id: str
    tokens: tuple[int, ...]  # the tokens whose keys and values this step computes
    start: int  # position of tokens[0]; positions start..start+len-1 are written
    blocks: tuple[int, ...]  # the sequence's block table: block i holds positions i*bs..
    sample: SampleSpec | None  # sample after the last token (None: a prefill chunk mid-way)


@dataclass(frozen=True, slots=True)
class StepPlan:
    step: int
    chunks: tuple[Chunk, ...]
    block_size: int

    @property
    def num_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks)


@dataclass(frozen=True, slots=True)
class StepOutput:
    step: int
    sampled: Mapping[str, int] = field(default_factory=dict)  # seq_id -> next token id
    compute_s: float = 0.0  # the runner's own time for the step, seconds
