"""What the generation policy publishes for the API's KV admission. Pure.

Beside decision 24's load report, the scheduler running a generation model says, per
model ref: its worker's KV pool (blocks, block size), the blocks in use, the blocks
that waiting sequences want per priority class (each the blocks of its prompt +
max_tokens: its worst case, what the policy's ``cost`` counts), and the decode rate:
tokens sampled per second of stepping over the last ``DECODE_RATE_WINDOW_S``. The API
decides from these (ingest/admission/kv.py).
"""

from __future__ import annotations

from collections import deque

from core.load_report import KVState
from core.vocab import PRIORITY_CLASSES
from scheduler.core.generation.policy import ContinuousBatcher

# The decode rate is measured over this window (s): decision 24's RATE_WINDOW_S, so it
# moves on the same time scale as the arrival rates admission compares; at 10-30 ms a
# step on this CPU it holds hundreds of steps.
DECODE_RATE_WINDOW_S = 5.0


class DecodeRate:
    """Tokens sampled per second of stepping over a recent window. Counting the time
    spent stepping (not wall time) gives what the batch delivers while busy, so an idle
    spell does not read as lost capacity; with no step in the window the last rate
    stands."""

    def __init__(self, window_s: float = DECODE_RATE_WINDOW_S):
        self.window_s = window_s
        self._steps: deque[tuple[float, float, int]] = deque()  # (at, step_s, sampled)
        self._busy_s = 0.0
        self._sampled = 0
        self.last = 0.0

    def add(self, now: float, step_s: float, sampled: int) -> float:
        self._steps.append((now, step_s, sampled))
        self._busy_s += step_s
        self._sampled += sampled
        return self.rate(now)

    def rate(self, now: float) -> float:
        while self._steps and self._steps[0][0] < now - self.window_s:
            _, s, n = self._steps.popleft()
            self._busy_s -= s
            self._sampled -= n
        if self._steps and self._busy_s > 0:
            self.last = self._sampled / self._busy_s
        return self.last


def kv_state(policy: ContinuousBatcher, decode_tok_s: float) -> KVState:
    """The pool, what holds it and what waits for it, by class name."""
    cfg = policy.cfg
    wanted = [0] * cfg.ranks
    for s in policy.waiting_sequences():
        wanted[s.rank] += cfg.blocks_for(s.cost(cfg.max_model_len))
    return KVState(
        num_blocks=cfg.num_blocks,
        block_size=cfg.block_size,
        used=policy.pool.used,
        wanted={c: wanted[i] for i, c in enumerate(PRIORITY_CLASSES) if i < cfg.ranks},
        decode_tok_s=round(decode_tok_s, 3),
    )
