"""Static batching on the continuous-batching machinery: a batch forms only once the
previous one has finished entirely, from what waits then (sequences that finish early
stop computing; new arrivals wait for the batch's longest member), KV reserved for each
member's worst case. No torch here: the whole-system benchmark puts it in a scheduler
process (bench/gpuhost/static_batching/sitecustomize.py)."""

from __future__ import annotations

from core.generation import StepPlan
from scheduler.core.generation.config import PolicyConfig
from scheduler.core.generation.policy import ContinuousBatcher
from scheduler.core.generation.text import Detokenize


class StaticBatcher(ContinuousBatcher):
    """Admission only into an empty batch."""

    def _admit(self, now: float) -> None:
        return  # nobody joins a running batch

    def schedule(self, now: float) -> StepPlan:
        # A batch forms from what waits when the previous one is done; its members all
        # enter at once (prefills spread over steps by the token budget).
        if not self.running:
            while len(self.running) < self.cfg.max_running and self._take_one(now):
                pass
        return super().schedule(now)

    def _take_one(self, now: float) -> bool:
        """The next sequence by rank (a preempted one first, then arrivals), if its
        worst case fits the pool beside the batch's."""
        for rank in range(self.cfg.ranks):
            resumed = self._resumed[rank]
            s = resumed[0] if resumed else self._waiting[rank].peek()
            if s is None:
                continue
            reserve = self.cfg.blocks_for(self._cost(s))
            if self.reserved_blocks + reserve > self.pool.num_blocks:
                return False
            self._start(s, rank, reserve, now)
            return True
        return False


class ServedStaticBatcher(StaticBatcher):
    """What a scheduler builds in its place: the same, with KV reserved for each
    member's worst case whatever the served configuration says (no preemption)."""

    def __init__(self, cfg: PolicyConfig, decode: Detokenize, eos_id: int | None = None):
        super().__init__(cfg.model_copy(update={"kv_overcommit": 1.0}), decode, eos_id)
