"""A generation request (what was asked) and its sequence (where it stands)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from scheduler.core.generation.text import Detokenize, IncrementalText


class FinishReason(StrEnum):
    STOP = "stop"  # end-of-text token, a stop token or a stop string (OpenAI's "stop")
    LENGTH = "length"  # max_tokens, or the model's context is full (OpenAI's "length")
    CANCELLED = "cancelled"  # the caller or its job went away
    EXPIRED = "expired"  # the deadline passed before the first token


class State(StrEnum):
    WAITING = "waiting"  # never admitted
    RUNNING = "running"  # holds KV blocks, in the batch
    PREEMPTED = "preempted"  # blocks dropped; prompt + output are recomputed on resume
    FINISHED = "finished"


@dataclass(frozen=True)
class GenRequest:
    seq_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    tenant: str = "t"
    weight: float = 1.0  # the tenant's plan weight (fairness inside its rank)
    flow: str | None = None  # the gateway's fairness id: fairness inside the tenant
    rank: int = 0  # priority class: 0 most urgent (enterprise, paid, free, jobs)
    temperature: float = 0.0
    seed: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    arrived_at: float = 0.0
    deadline: float = math.inf  # for the first token; a started stream runs to its end
    # Output tokens an earlier run already produced and delivered (a request picked up
    # again after its scheduler died): recomputed with the prompt, never sent again;
    # generation goes on at index len(resume_output).
    resume_output: tuple[int, ...] = ()
    # Characters of that output's text already delivered (a stream holds back the end of
    # a stop string's possible start and of an unfinished UTF-8 character): released
    # later, like any held-back text. None: all of it.
    resume_emitted: int | None = None


@dataclass(eq=False)
class Sequence:
    req: GenRequest
    text: IncrementalText
    order: int  # arrival order, the tie-break everywhere (earlier first)
    output: list[int] = field(default_factory=list)
    computed: int = 0  # tokens whose keys and values are in the cache
    blocks: list[int] = field(default_factory=list)
    state: State = State.WAITING
    preemptions: int = 0
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    # Seconds between consecutive tokens this run produced (a pause for a preemption or
    # a queued step included: the caller waited it). Kept in memory, summarized in the
    # final row: no write per token.
    token_gaps: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, req: GenRequest, decode: Detokenize, order: int) -> Sequence:
        s = cls(req=req, text=IncrementalText(decode, req.stop), order=order)
        if req.resume_output:
            s.output = list(req.resume_output)
            s.text.push(s.output)
            done = len(s.text.text) if req.resume_emitted is None else req.resume_emitted
            s.text.emitted = min(done, len(s.text.text))  # delivered before: not sent again
        return s

    @property
    def seq_id(self) -> str:
        return self.req.seq_id

    @property
    def tenant(self) -> str:
        return self.req.tenant

    @property
    def weight(self) -> float:
        return self.req.weight

    @property
    def flow(self) -> str | None:
        return self.req.flow

    @property
    def rank(self) -> int:
        return self.req.rank

    @property
    def total(self) -> int:
        return len(self.req.prompt) + len(self.output)

    @property
    def pending(self) -> int:
        """Tokens still to compute before the next token can be sampled."""
        return self.total - self.computed

    def cost(self, max_model_len: int) -> int:
        """Its worst-case claim on the KV cache, in tokens: what fairness charges."""
        return min(len(self.req.prompt) + self.req.max_tokens, max_model_len)

    def token_at(self, pos: int) -> int:
        n = len(self.req.prompt)
        return self.req.prompt[pos] if pos < n else self.output[pos - n]

    def tokens(self, start: int, n: int) -> tuple[int, ...]:
        p = len(self.req.prompt)
        if start + n <= p:
            return self.req.prompt[start : start + n]
        return tuple(self.token_at(i) for i in range(start, start + n))
