"""Continuous batching: which sequences compute which tokens in the next step. Pure.

The shape of vLLM v1's scheduler: no prefill or decode phase, only sequences whose
computed tokens lag their known tokens. ``schedule(now)`` fills a token budget:
running sequences first, in priority order (one token each when decoding, a chunk
when prefilling), then preempted sequences and new arrivals, rank by rank, tenants
inside a rank by token-cost deficit round robin (the scheduler's one fair queue,
scheduler/core/fairness.py), prompts chunked to the budget that is left.
``update(plan, output, now)`` applies the sampled tokens and returns events: a token
per sequence, finished sequences (their blocks freed at once, so the next step's
arrivals can use them), preemptions.

KV blocks are allocated when a step needs them. When none are left the
lowest-priority running sequence is preempted: its blocks are dropped and it
recomputes prompt + output when it resumes (decision 23: recompute, not swap). A new
arrival may preempt running sequences of a lower rank only, never of its own.
Deadlines are for the first token: a sequence still waiting at its deadline expires.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import insort
from collections.abc import Iterable

from core.generation import Chunk, SampleSpec, StepOutput, StepPlan
from scheduler.core.fairness import FairQueue
from scheduler.core.generation.blocks import BlockPool
from scheduler.core.generation.config import PolicyConfig
from scheduler.core.generation.events import Event, Finished, Preempted, Token
from scheduler.core.generation.sequence import FinishReason, GenRequest, Sequence, State
from scheduler.core.generation.text import Detokenize


class InvalidRequest(ValueError):
    """A request the policy can never run (the API's validation should have caught it)."""


class ContinuousBatcher:
    def __init__(self, cfg: PolicyConfig, decode: Detokenize, eos_id: int | None = None):
        self.cfg = cfg
        self._decode = decode
        self._eos = eos_id
        self.pool = BlockPool(cfg.num_blocks)
        self.running: list[Sequence] = []
        self._waiting = [FairQueue[Sequence](cfg.drr_quantum, self._cost) for _ in range(cfg.ranks)]
        self._resumed: list[list[Sequence]] = [[] for _ in range(cfg.ranks)]  # by arrival
        self._seqs: dict[str, Sequence] = {}
        self._deadlines: list[tuple[float, int, str]] = []  # heap over waiting sequences
        self._order = itertools.count()
        self._step = 0
        self._events: list[Event] = []  # from schedule(), handed out by the next update()
        self._budget = 0  # tokens left in the step being planned
        self._planned: dict[str, int] = {}  # seq_id -> tokens in the step being planned
        self.reserved_blocks = 0  # running sequences' worst-case blocks (kv_overcommit)
        self.preemptions = 0
        self.expired = 0

    # -- intake -------------------------------------------------------------------

    def _cost(self, s: Sequence) -> int:
        return s.cost(self.cfg.max_model_len)

    def add(self, req: GenRequest) -> None:
        if req.seq_id in self._seqs:
            raise InvalidRequest(f"sequence {req.seq_id!r} is already here")
        if not req.prompt:
            raise InvalidRequest("prompt has no tokens")
        if len(req.prompt) >= self.cfg.max_model_len:
            raise InvalidRequest(
                f"prompt is {len(req.prompt)} tokens; the model holds {self.cfg.max_model_len} "
                "with the output"
            )
        if req.max_tokens <= len(req.resume_output):
            raise InvalidRequest("max_tokens must exceed the tokens already generated")
        if len(req.prompt) + len(req.resume_output) >= self.cfg.max_model_len:
            raise InvalidRequest("prompt and resumed output fill the model's context")
        if not 0 <= req.rank < self.cfg.ranks:
            raise InvalidRequest(f"rank {req.rank} outside 0..{self.cfg.ranks - 1}")
        s = Sequence.of(req, self._decode, next(self._order))
        self._seqs[req.seq_id] = s
        self._waiting[req.rank].push(s)
        if req.deadline != float("inf"):
            heapq.heappush(self._deadlines, (req.deadline, s.order, req.seq_id))

    def cancel(self, seq_id: str, now: float) -> Finished | None:
        """Drop a sequence wherever it is (its caller or job went away)."""
        s = self._seqs.get(seq_id)
        if s is None:
            return None
        return self._finish(s, FinishReason.CANCELLED, now)

    def drop_cache(self, now: float) -> None:
        """The runner lost its KV pool (its worker restarted): every running sequence
        is preempted and will recompute; their events come with the next update."""
        for s in sorted(self.running, key=self._victim_key, reverse=True):
            self._preempt(s, now)

    # -- state --------------------------------------------------------------------

    def __contains__(self, seq_id: str) -> bool:
        return seq_id in self._seqs

    def sequence(self, seq_id: str) -> Sequence | None:
        return self._seqs.get(seq_id)

    def has_work(self) -> bool:
        return bool(self._seqs) or bool(self._events)

    def waiting_sequences(self) -> Iterable[Sequence]:
        """Sequences not holding blocks: new arrivals and preempted ones."""
        for q in self._waiting:
            yield from q
        for r in self._resumed:
            yield from r

    @property
    def num_waiting(self) -> int:
        return sum(len(q) for q in self._waiting) + sum(len(r) for r in self._resumed)

    # -- schedule -----------------------------------------------------------------

    def schedule(self, now: float) -> StepPlan:
        self._step += 1
        self._expire(now)
        self._budget = self.cfg.max_step_tokens
        self._planned = {}
        preempted_now = False
        # A token is kept for every decoding sequence, so a long prompt being prefilled
        # (even of a higher rank) never stalls the running streams: it gets the rest.
        decodes = sum(1 for s in self.running if s.pending == 1)
        for s in sorted(self.running, key=self._priority):
            if self._budget == 0:
                break
            if s.state is not State.RUNNING:  # preempted earlier in this loop
                continue
            if s.pending == 1:
                decodes -= 1
                n = 1
            else:
                n = min(s.pending, self._budget - decodes)
                if n <= 0:
                    continue
            while self.cfg.blocks_for(s.computed + n) - len(s.blocks) > self.pool.free:
                victim = max(self.running, key=self._victim_key)
                self._preempt(victim, now)
                preempted_now = True
                if victim is s:
                    break
            if s.state is State.RUNNING:
                self._plan(s, n)
        # Admitting while preempting would only evict what was just let in (vLLM does
        # the same): new work waits for the next step.
        if not preempted_now:
            self._admit(now)
        chunks = tuple(self._chunk(self._seqs[i], n) for i, n in self._planned.items())
        self._planned = {}
        return StepPlan(step=self._step, chunks=chunks, block_size=self.cfg.block_size)

    def _plan(self, s: Sequence, n: int) -> None:
        extra = self.cfg.blocks_for(s.computed + n) - len(s.blocks)
        if extra > 0:
            s.blocks.extend(self.pool.allocate(extra))
        self._planned[s.seq_id] = n
        self._budget -= n

    def _priority(self, s: Sequence) -> tuple[int, int]:
        return (s.rank, s.order)

    def _victim_key(self, s: Sequence) -> tuple[int, float, int]:
        """Lowest priority first: highest rank; inside it, the tenant holding the most
        blocks per unit of weight; then the latest arrival (LIFO, as vLLM)."""
        held = sum(len(x.blocks) for x in self.running if x.tenant == s.tenant and x.rank == s.rank)
        return (s.rank, held / max(s.weight, 1e-3), s.order)

    def _admit(self, now: float) -> None:
        for rank in range(self.cfg.ranks):
            while self._budget > 0 and len(self.running) < self.cfg.max_running:
                resumed = self._resumed[rank]
                s = resumed[0] if resumed else self._waiting[rank].peek()
                if s is None:
                    break
                n = min(s.pending, self._budget)
                reserve = self.cfg.blocks_for(self._cost(s))
                preemptions = self.preemptions
                if not self._make_room(s, n, reserve, now):
                    return  # strict priority: nothing of a lower rank passes it
                self._start(s, rank, reserve, now)
                self._plan(s, n)
                if self.preemptions != preemptions:
                    return  # what it evicted must not come straight back in this step

    def _start(self, s: Sequence, rank: int, reserve: int, now: float) -> None:
        """``s``, the front of its rank (a preempted one first, then arrivals), into the
        running batch with ``reserve`` KV blocks."""
        if self._resumed[rank]:
            self._resumed[rank].pop(0)
        else:
            self._waiting[rank].pop()
        s.state = State.RUNNING
        if s.admitted_at is None:
            s.admitted_at = now
        self.running.append(s)
        self.reserved_blocks += reserve

    def _growth(self, extra: Sequence | None = None, extra_n: int = 0) -> int:
        """Blocks the running sequences (and ``extra`` with ``extra_n`` tokens planned)
        take at their next token: admission leaves them free, or the next step would
        preempt what was just admitted."""
        bs = self.cfg.block_size
        grow = sum(
            1 for x in self.running if (x.computed + self._planned.get(x.seq_id, 0)) % bs == 0
        )
        return grow + (1 if extra is not None and extra_n % bs == 0 else 0)

    def _make_room(self, s: Sequence, n: int, reserve: int, now: float) -> bool:
        """Whether ``s`` fits now (its first ``n`` tokens' blocks free, with the next
        step's growth; its worst case ``reserve`` within the overcommit limit),
        preempting lower-rank sequences if that makes it fit."""
        limit = self.cfg.kv_overcommit * self.pool.num_blocks
        need = self.cfg.blocks_for(n)

        def fits() -> bool:
            free = self.pool.free - self._growth(s, n)
            return need <= free and self.reserved_blocks + reserve <= limit

        if fits():
            return True
        lower = [x for x in self.running if x.rank > s.rank]
        freeable = sum(len(x.blocks) for x in lower)
        unreserve = sum(self.cfg.blocks_for(self._cost(x)) for x in lower)
        if need > self.pool.free + freeable or self.reserved_blocks - unreserve + reserve > limit:
            return False
        while not fits() and lower:
            self._preempt(max(lower, key=self._victim_key), now)
            lower = [x for x in lower if x.state is State.RUNNING]
        return fits()

    def _chunk(self, s: Sequence, n: int) -> Chunk:
        end = s.computed + n
        sample = None
        if end == s.total:  # the chunk reaches the last known token: sample the next one
            sample = SampleSpec(s.req.temperature, s.req.seed, len(s.output))
        return Chunk(s.seq_id, s.tokens(s.computed, n), s.computed, tuple(s.blocks), sample)

    def _preempt(self, s: Sequence, now: float) -> None:
        self._budget += self._planned.pop(s.seq_id, 0)  # its tokens go back to the step
        self._release(s)
        s.state = State.PREEMPTED
        s.preemptions += 1
        self.preemptions += 1
        insort(self._resumed[s.rank], s, key=lambda x: x.order)
        self._events.append(Preempted(s.seq_id, s.computed, now))
        s.computed = 0

    def _release(self, s: Sequence) -> None:
        if s.state is State.RUNNING:
            self.running.remove(s)
            self.reserved_blocks -= self.cfg.blocks_for(self._cost(s))
        self.pool.release(s.blocks)
        s.blocks = []

    def _expire(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, order, seq_id = heapq.heappop(self._deadlines)
            s = self._seqs.get(seq_id)
            if s is None or s.order != order:
                continue  # finished already (and the id perhaps reused)
            # Only a sequence with no token yet: a started stream is not cut off.
            if not s.output and s.state is not State.RUNNING:
                self.expired += 1
                self._events.append(self._finish(s, FinishReason.EXPIRED, now))

    # -- update -------------------------------------------------------------------

    def update(self, plan: StepPlan, output: StepOutput, now: float) -> list[Event]:
        events, self._events = self._events, []
        for chunk in plan.chunks:
            s = self._seqs.get(chunk.seq_id)
            if s is None or s.state is not State.RUNNING or s.computed != chunk.start:
                continue  # cancelled (or preempted) since the plan was made
            s.computed = chunk.start + len(chunk.tokens)
            if chunk.sample is None:
                continue
            if chunk.seq_id not in output.sampled:
                raise ValueError(f"step {plan.step}: no token sampled for {chunk.seq_id!r}")
            events.extend(self._append(s, output.sampled[chunk.seq_id], now))
        return events

    def _append(self, s: Sequence, token: int, now: float) -> Iterable[Event]:
        req = s.req
        if s.first_token_at is None:
            s.first_token_at = now
        if s.last_token_at is not None:
            s.token_gaps.append(now - s.last_token_at)
        s.last_token_at = now
        index = len(s.output)
        s.output.append(token)
        if (token == self._eos and not req.ignore_eos) or token in req.stop_token_ids:
            s.output.pop()  # a stop token ends the answer and is not part of its text
            yield Token(s.seq_id, index, token, "", now)
            yield self._finish(s, FinishReason.STOP, now)
            return
        text, stopped = s.text.push(s.output)
        yield Token(s.seq_id, index, token, text, now)
        if stopped:
            yield self._finish(s, FinishReason.STOP, now)
        elif len(s.output) >= req.max_tokens or s.total >= self.cfg.max_model_len:
            yield self._finish(s, FinishReason.LENGTH, now)

    def _finish(self, s: Sequence, reason: FinishReason, now: float) -> Finished:
        if s.state is State.WAITING:
            self._waiting[s.rank].remove(s)
        elif s.state is State.PREEMPTED:
            self._resumed[s.rank].remove(s)
        self._release(s)
        s.state = State.FINISHED
        del self._seqs[s.seq_id]
        tail = s.text.flush()  # held-back text (after a stop string there is none)
        return Finished(
            seq_id=s.seq_id,
            reason=reason,
            text=s.text.text,
            tail=tail,
            token_ids=tuple(s.output),
            prompt_tokens=len(s.req.prompt),
            arrived_at=s.req.arrived_at,
            first_token_at=s.first_token_at,
            finished_at=now,
            preemptions=s.preemptions,
            token_gaps=tuple(s.token_gaps),
        )
