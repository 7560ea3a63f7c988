"""How to cut one length-sorted batch into sub-batches that replay captured CUDA graphs.

Pure (no torch): the worker calls it per batch, the unit tests run it on CPU.

A sub-batch of rows ``[a, b)`` of the ascending lengths is padded to
``seq_pad(lens[b-1])`` tokens and replays the smallest captured graph with at least
``b - a`` rows at that length (the extra rows are computed and dropped). Each graph
shape has a cost (measured at warmup, else ``fit_ms``), and the plan minimizes the
summed cost: a dynamic programme over cut positions. Cuts are allowed where the
padded length changes and every ``step`` rows, which keeps it at a few thousand
steps for a batch of 1,024 (about a millisecond of Python) while losing almost
nothing against cutting anywhere.

A greedy cut (as many rows as fit the bucket at the longest one, then round up to
a graph) pays twice for a mixed batch: a sub-batch spanning 8..60 tokens pads all of
them to 64, and 300 rows replay a 512-row graph. The plan fills graphs exactly and
keeps each sub-batch inside one padded length where that is cheaper.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence


def fit_ms(rows: int, seq: int) -> float:
    """Graph replay time fitted on an H200 (docs/bench/gpu.md, max error 6%): a fixed
    launch chain, per token, per row, and attention's rows x len^2. Only the ratios
    matter to the plan; a worker on CUDA replaces it with its own measurements."""
    return 0.21 + 6.4e-5 * rows * seq + 2.0e-3 * rows + 1.04e-7 * rows * seq * seq


def plan(
    lens: Sequence[int],
    seq_pad: Callable[[int], int],
    graph_rows: Callable[[int], Sequence[int]],
    cost: Callable[[int, int], float],
    step: int = 1,
) -> list[tuple[int, int, int, int]]:
    """Sub-batches ``(start, end, graph_rows, padded_len)`` covering ascending ``lens``.

    ``graph_rows(s)``: ascending captured row counts at padded length ``s``; the last
    is the most rows a sub-batch may hold there.
    """
    n = len(lens)
    if n == 0:
        return []
    pad_of = {x: seq_pad(x) for x in set(lens)}  # a few distinct lengths, many inputs
    pads = [pad_of[x] for x in lens]
    if any(b < a for a, b in itertools.pairwise(pads)):
        raise ValueError("lens must be ascending")
    # Candidate cut positions: every ``step`` rows and wherever the padded length grows.
    cuts = set(range(0, n, max(1, step))) | {n}
    cuts.update(i for i in range(1, n) if pads[i] != pads[i - 1])
    pos = sorted(cuts)
    ladders: dict[int, list[int]] = {}
    costs: dict[int, list[float]] = {}
    for s in set(pads):
        ladders[s] = list(graph_rows(s))
        costs[s] = [cost(g, s) for g in ladders[s]]
    inf = float("inf")
    best = {0: 0.0}
    choice: dict[int, tuple[int, int]] = {}  # end -> (start, ladder index)
    for i in pos[1:]:
        s = pads[i - 1]
        ladder, cs = ladders[s], costs[s]
        b_i, c_i = inf, (0, 0)
        # best[] grows with the rows covered, so for each graph the earliest start it
        # can hold is the one to try; fewer rows may fit a smaller graph.
        prev = -1
        for g in ladder:
            jx = bisect.bisect_left(pos, i - g)
            j = pos[jx]
            if j >= i or j == prev:
                continue
            prev = j
            k = bisect.bisect_left(ladder, i - j)
            c = best[j] + cs[k]
            if c < b_i:
                b_i, c_i = c, (j, k)
        best[i] = b_i
        choice[i] = c_i
    out: list[tuple[int, int, int, int]] = []
    i = n
    while i > 0:
        j, k = choice[i]
        s = pads[i - 1]
        out.append((j, i, ladders[s][k], s))
        i = j
    out.reverse()
    return out
