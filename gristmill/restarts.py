"""When a process that ``gristmill dev`` or ``gristmill host`` started and that died is
started again (decision 46): pure policy, the clock passed in, as an orchestrator's
restart policy does it; the thresholds come at construction.

A process that dies after a healthy run is started again at once; one that keeps dying
soon after its start waits twice as long each time (Kubernetes' CrashLoopBackOff, scaled
to one machine: 1 s doubling up to 30 s by default, against the kubelet's 10 s up to
5 min; ``gristmill host`` caps it at 10 s),
so a process that cannot start (a port taken, a broken setting) does not spin a core.
One that ran ``STABLE_S`` before dying counts as healthy again: its next restart is
immediate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0
# Longer than any start-up of ours (the API answers in seconds, a scheduler joins its
# group and its workers load the models within a minute here): a process that lived
# this long died of something other than its start.
STABLE_S = 60.0


@dataclass
class _Record:
    started_at: float
    restarts: int = 0  # restarts so far
    delay_s: float = 0.0  # the wait before the next restart, while it keeps crashing


@dataclass
class RestartPolicy:
    first_delay_s: float = FIRST_DELAY_S
    max_delay_s: float = MAX_DELAY_S
    stable_s: float = STABLE_S
    _procs: dict[str, _Record] = field(default_factory=dict)

    def started(self, name: str, now: float) -> None:
        rec = self._procs.get(name)
        if rec is None:
            self._procs[name] = _Record(started_at=now)
        else:
            rec.started_at = now

    def died(self, name: str, now: float) -> float:
        """A process exited on its own: when (from ``now``) to start it again."""
        rec = self._procs.setdefault(name, _Record(started_at=now))
        rec.restarts += 1
        if now - rec.started_at >= self.stable_s:
            rec.delay_s = 0.0  # it ran: this death is news, not a crash loop
        else:
            rec.delay_s = min(self.max_delay_s, max(self.first_delay_s, 2 * rec.delay_s))
        return now + rec.delay_s

    def restarts(self, name: str) -> int:
        rec = self._procs.get(name)
        return rec.restarts if rec is not None else 0
