"""What the policy tells the world after each step (``ContinuousBatcher.update``).

Part of the way to the caller: ``Token`` events carry one sequence's new token and
the text it released, in order, with ``index`` (0 = the first output token) so a
stream that reconnects can resume after the last index it saw.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.generation.sequence import FinishReason


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


@dataclass(frozen=True, slots=True)
class Preempted:
    """The sequence's KV blocks were dropped; it will recompute prompt + output so far.
    Its stream only pauses: no token is taken back."""

    seq_id: str
    dropped_tokens: int
    at: float


Event = Token | Finished | Preempted
