"""A generation request message (from Kafka) into the policy's ``GenRequest``. Pure.

The message carries the prompt's token ids when the API tokenized it
(core/models/token_ids.py; ``/v1/completions``, ``/v1/infer``) and its text when it
did not (a job item, stored as the client sent it): then ``encode`` makes the ids.
The parameters were checked where the request entered; a message that still carries
unusable ones (another producer, a damaged record) is refused with the reason, and
recorded as failed rather than run.

What was already streamed before this scheduler got the request (``Progress``, read
from PostgreSQL: its scheduler died, or its partition moved) is recomputed with the
prompt and never sent again (``resume_output``); the characters already released
stay released (``resume_emitted``), so the stream goes on exactly where it stopped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from core.messages import RequestMessage
from core.models.token_ids import decode_ids, is_tokenized
from scheduler.core.generation.sequence import GenRequest

Encode = Callable[[str], Sequence[int]]

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class Progress:
    """Tokens a request already streamed: ids and the text each released, in order."""

    token_ids: tuple[int, ...] = ()
    texts: tuple[str, ...] = ()

    @property
    def emitted(self) -> int:
        return sum(len(t) for t in self.texts)


@dataclass(frozen=True)
class Refused:
    reason: str


@dataclass
class Prepared:
    req: GenRequest
    prompt_tokens: int
    prior_texts: tuple[str, ...] = field(default_factory=tuple)


def sampling_seed(seed: int, item_index: int | None) -> int:
    """The sampler's seed: the request's own, or for a job item its job's seed mixed with
    the item's index, so the items of one job draw differently while each repeats its
    own draw when it runs again."""
    if item_index is None:
        return seed & _MASK64
    x = (seed ^ (item_index * 0x9E3779B97F4A7C15)) & _MASK64  # golden-ratio spread
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    return x ^ (x >> 31)


def prepare(
    msg: RequestMessage,
    *,
    rank: int,
    encode: Encode,
    stop_token_ids: Sequence[int] = (),
    context_length: int,
    progress: Progress | None = None,
) -> Prepared | Refused:
    """The policy's request for ``msg`` (its sequence id is the request id)."""
    value = msg.input
    if is_tokenized(value):
        prompt = tuple(decode_ids(value["ids"]))
    elif isinstance(value, str):
        prompt = tuple(encode(value))
    else:
        return Refused(f"the prompt must be text, not {type(value).__name__}")
    if not prompt:
        return Refused("the prompt has no tokens")
    if len(prompt) >= context_length:
        return Refused(f"the prompt's {len(prompt)} tokens fill the {context_length}-token context")
    p = msg.params
    max_tokens, temperature, seed, stop = (
        p.get("max_tokens"),
        p.get("temperature", 0.0),
        p.get("seed"),
        p.get("stop") or [],
    )
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        return Refused("params.max_tokens must be a positive integer")
    if (
        not isinstance(temperature, int | float)
        or isinstance(temperature, bool)
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        return Refused("params.temperature must be a number of at least 0")
    if temperature > 0 and (not isinstance(seed, int) or isinstance(seed, bool)):
        return Refused("a sampled request (temperature > 0) must carry an integer params.seed")
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        return Refused("params.stop must be a list of strings")
    # The context caps the answer: it ends with "length" when full (OpenAI's rule for an
    # answer that reaches the model's context).
    max_tokens = min(max_tokens, context_length - len(prompt))
    done = progress or Progress()
    resume = done.token_ids[: max_tokens - 1]  # at least one token is left to generate
    texts = done.texts[: len(resume)]
    req = GenRequest(
        seq_id=msg.request_id,
        prompt=prompt,
        max_tokens=max_tokens,
        tenant=msg.tenant_id,
        weight=msg.weight,
        flow=msg.fairness_id,
        rank=rank,
        temperature=float(temperature),
        seed=sampling_seed(seed, msg.item_index) if isinstance(seed, int) else 0,
        stop=tuple(stop),
        stop_token_ids=tuple(stop_token_ids),
        arrived_at=msg.received_at,
        deadline=msg.deadline,
        resume_output=resume,
        resume_emitted=sum(len(t) for t in texts) if resume else None,
    )
    return Prepared(req, len(prompt), texts)
