"""What the policy tells the world after each step (``ContinuousBatcher.update``).

Part of the way to the caller: ``Token`` events carry one sequence's new token and
the text it released, in order, with ``index`` (0 = the first output token) so a
stream that reconnects can resume after the last index it saw.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from scheduler.core.generation.sequence import FinishReason


@dataclass(frozen=True, slots=True)
class Token:
    seq_id: str
    index: int  # which output token (0 = first)
    token_id: int
    text: str  # newly released text (may be "" while a stop string or a character is pending)
    at: float


@dataclass(frozen=True, slots=True)
class Finished:
    seq_id: str
    reason: FinishReason
    text: str  # the whole answer (stop string excluded)
    tail: str  # text not yet sent in a Token event (release it after the last token)
    token_ids: tuple[int, ...]
    prompt_tokens: int
    arrived_at: float
    first_token_at: float | None
    finished_at: float
    preemptions: int
    token_gaps: tuple[float, ...] = ()  # s between consecutive tokens (sequence.py)


@dataclass(frozen=True, slots=True)
class Preempted:
    """The sequence's KV blocks were dropped; it will recompute prompt + output so far.
    Its stream only pauses: no token is taken back."""

    seq_id: str
    dropped_tokens: int
    at: float


@dataclass(frozen=True, slots=True)
class Failed:
    """The model raised on a step that ran this sequence: it ends without an answer
    (the step loop's ``fail_running``; the policy has forgotten it)."""

    seq_id: str
    error: str
    at: float


Event = Token | Finished | Preempted | Failed


def gap_summary(gaps: Iterable[float]) -> dict[str, float] | None:
    """Inter-token latency of one answer in ms: median, 95th percentile (nearest rank)
    and longest gap; None with fewer than two tokens. Pure."""
    ordered = sorted(gaps)
    if not ordered:
        return None

    def rank(q: float) -> float:
        return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)] * 1000, 3)

    return {"p50": rank(0.5), "p95": rank(0.95), "max": round(ordered[-1] * 1000, 3)}
