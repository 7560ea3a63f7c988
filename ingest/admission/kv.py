"""Admission of completions from the KV cache. Pure; the clock is passed in.

The scheduler running a generation model publishes its cache with its load report
(core/load_report.py's ``KVState``): the pool, the blocks in use, the blocks waiting
sequences want per class (prompt + max_tokens each, the policy's worst case) and the
decode rate. For one completion needing ``need`` blocks (decision 32):

1. **Never fits.** ``need`` beyond the largest worker's whole pool: no wait makes
   room, so 400 naming ``max_tokens`` (the caller's to change), at once.
2. **Wait for blocks.** The blocks wanted by waiting sequences of its class and every
   higher one, plus its own, less the free blocks, are the shortfall; running
   sequences free blocks as they decode, at the free-block rate (decode tokens/s over
   the block size: every ``block_size`` tokens decoded fill a block that the sequence
   returns when it ends). When that wait exceeds the first-token deadline, 503 with
   Retry-After = the excess wait (at least 1 s). Lower classes count more demand ahead
   of them, so under a saturated pool the lowest tier is shed first.

No report (no scheduler has stepped the model yet), or no decode measured while
blocks are short: admit, as decision 24 does without a report; the scheduler's policy
still admits by free blocks and expires what misses its deadline. Several schedulers'
pools add up (requests spread over their partitions).

Not counted: blocks the running sequences will still take as they grow (the report
does not say how far each is from its end).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.load_report import KVState
from core.vocab import PRIORITY_CLASSES, PriorityClass

# Retry-After floor (s): HTTP's unit; a shorter wait is still "retry shortly".
MIN_RETRY_S = 1.0


@dataclass(frozen=True)
class KVDecision:
    admit: bool
    never_fits: bool = False
    wait_s: float = 0.0  # predicted wait for blocks
    retry_after_s: float = 0.0
    message: str = ""


KV_ADMIT = KVDecision(True)


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // max(1, block_size))


def decide_kv(
    states: Sequence[KVState],
    priority: str,
    prompt_tokens: int,
    max_tokens: int,
    *,
    now: float,
    deadline: float,
) -> KVDecision:
    """``deadline``: the first token's, on the same clock as ``now`` (s)."""
    if not states:
        return KV_ADMIT
    tokens = prompt_tokens + max_tokens
    largest = max(states, key=lambda s: s["num_blocks"] * s["block_size"])
    if blocks_for(tokens, largest["block_size"]) > largest["num_blocks"]:
        held = largest["num_blocks"] * largest["block_size"]
        return KVDecision(
            False,
            never_fits=True,
            message=(
                f"the model's KV cache holds {held} tokens; you requested {tokens} "
                f"({prompt_tokens} in your prompt; {max_tokens} for the completion); "
                "reduce the prompt or max_tokens"
            ),
        )
    rank = PriorityClass(priority).rank
    ahead = set(PRIORITY_CLASSES[: rank + 1])
    shortfall = 0.0
    blocks_s = 0.0
    for s in states:
        # Each scheduler's share of this request: requests spread over the schedulers.
        need = blocks_for(tokens, s["block_size"]) / len(states)
        wanted = sum(n for c, n in s["wanted"].items() if c in ahead)
        shortfall += wanted + need - (s["num_blocks"] - s["used"])
        blocks_s += s["decode_tok_s"] / max(1, s["block_size"])
    if shortfall <= 0 or blocks_s <= 0:
        return KV_ADMIT
    wait = shortfall / blocks_s
    left = deadline - now
    if wait <= left:
        return KVDecision(True, wait_s=wait)
    return KVDecision(
        False,
        wait_s=wait,
        retry_after_s=max(MIN_RETRY_S, wait - max(0.0, left)),
        message=(
            f"the KV cache is full: {shortfall:.0f} blocks short at {priority} priority and "
            f"above, freed at {blocks_s:.1f} blocks/s, a wait of {wait:.1f} s past the "
            f"first-token deadline of {max(0.0, left):.1f} s"
        ),
    )
