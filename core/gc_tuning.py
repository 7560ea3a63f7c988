"""The collector settings of the processes on the request path (the API's and the
scheduler's): Python's cyclic garbage collector, tuned for a stream of short-lived
objects.

Each request leaves a few short-lived containers (in the scheduler the decoded dict,
its params, the request, its queue entry, its row; in the API the ASGI scope, the
message, its future and the answer), almost all freed by reference counting. With
the default thresholds (700, 10, 10) they still start a young collection every few
hundred messages, and every tenth of those an older one that walks the queued
requests; a full collection also walks every object made at start-up (modules,
settings, clients). Freezing what exists once start-up is done moves it out of the
collector's sight, and a young threshold of ``GEN0_THRESHOLD`` makes collections
rarer without letting garbage cycles pile up for long: at 30,000 messages/s a young
collection still runs several times a second.

Measured with ``bench.store.persist --rows 200000 --kind sync`` on the 2-core dev box,
the same code with and without this (steady state, two quiet runs each): the scheduler
spends 26 rather than 40 us of CPU a persisted row, and persists 24,700 rather than
18,900 rows/s. The API, in process (``FREEZE=1 bench/api_cpu.py 3000`` against the same
with ``GEN0=50000``, two runs each): 118-120 against 112 us of CPU a request, and its young
collections went from 73 per 1,000 requests to none. What it costs: garbage cycles (rare
here) wait up to 50,000 allocations.
"""

from __future__ import annotations

import gc

# Allocations (net of frees) between young collections; the default is 700.
GEN0_THRESHOLD = 50_000


def tune_gc() -> None:
    """Call once, when start-up is done and before the consumer lanes start."""
    gc.collect()  # what start-up left as garbage is freed, not frozen
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
