"""Staggered starts for background batches. Pure: no clock, no I/O.

A sync request that arrives while every worker runs a job batch waits for the
first worker to come free. If the workers' batches started together, that can be
a whole batch time; if their starts are spread evenly, it is at most a batch time
divided by the number of workers, the same order as the linger a sync request
spends anyway. So a worker about to start background work (job items only, no
sync request waiting) holds it until its start is at least ``predicted / n``
after every batch another worker started. Once the workers are spread this
costs nothing (each restarts the moment it finishes); it only corrects the
phase, for example after all workers picked up a new job at the same instant.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Running:
    started_at: float
    predicted_s: float  # its predicted compute time


def background_hold_until(now: float, others: list[Running], n_workers: int) -> float:
    """The earliest time a background batch may start on this worker (``now`` if at once).

    ``others`` are the batches running on the other workers that share a model with
    this one; ``n_workers`` counts those workers and this one.
    """
    if n_workers < 2:
        return now
    hold = now
    for r in others:
        gap = r.predicted_s / n_workers
        if now - r.started_at < gap:
            hold = max(hold, r.started_at + gap)
    return hold
