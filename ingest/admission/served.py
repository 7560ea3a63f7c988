"""What the jobs class of one model was served, as this API instance saw it. Pure; the
clock is passed in.

A completion quote (ingest/jobs/quote.py, decision 69) predicts the rate jobs get from
the workers' capacity less the sync classes' take. What jobs really got also pays for
what that leaves out: gaps between batches, the cost of these inputs against the
curve's average, the scheduler's own pace. Every backlog read (one row per unfinished
job of the model, with the items it has left) is a sample; the items the backlog lost
between two samples were served in between. So the history answers: how many job items
a second the model served over the last ``h`` seconds.

A sample with nothing left forgets the history: an idle class's rate says nothing of
what a backlogged one gets. A job gone from the next sample finished: what it had left
was served, but at most what the workers could serve meanwhile (a cancelled job goes
too, and its items were not served).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

# Samples closer than this are not kept (every poll of every job reads the backlog).
EVERY_S = 1.0
# As far back as a rate is asked for (the quote's horizon is capped by the admitted
# sync history, QUOTE_HISTORY_S); older samples go.
KEEP_S = 3600.0
# A window shorter than this is a few batches' worth: not a rate yet.
MIN_WINDOW_S = 5.0


class ServedHistory:
    def __init__(self) -> None:
        self._samples: deque[tuple[float, float]] = deque()  # (when, served so far)
        self._last: dict[str, float] = {}  # each job's items left at the last sample

    def record(self, now: float, remaining: Mapping[str, float], capacity_s: float) -> None:
        """A backlog read at ``now``: each unfinished job's items left; ``capacity_s``:
        the most items a second the workers serve (bounds what a vanished job counts)."""
        if not any(r > 0 for r in remaining.values()):
            self._samples.clear()
            self._last = {}
            return
        if not self._samples:
            self._samples.append((now, 0.0))
            self._last = dict(remaining)
            return
        at, served = self._samples[-1]
        if now - at < EVERY_S:
            return
        left = self._last
        fell = sum(max(0.0, n - remaining[j]) for j, n in left.items() if j in remaining)
        gone = sum(n for j, n in left.items() if j not in remaining)
        served += fell + min(gone, max(0.0, capacity_s) * (now - at))
        self._samples.append((now, served))
        self._last = dict(remaining)
        while now - self._samples[0][0] > KEEP_S:
            self._samples.popleft()

    def rate(self, horizon_s: float) -> tuple[float, float] | None:
        """(items/s served, over how many seconds) across the last ``horizon_s`` of
        samples; None without a window of ``MIN_WINDOW_S`` in it."""
        if len(self._samples) < 2:
            return None
        end_t, end = self._samples[-1]
        start = next((s for s in self._samples if end_t - s[0] <= horizon_s), None)
        if start is None or end_t - start[0] < MIN_WINDOW_S:
            return None
        window = end_t - start[0]
        return (end - start[1]) / window, window


def blended_rate(predicted: float, observed: tuple[float, float] | None, horizon_s: float) -> float:
    """The rate jobs get over the next ``horizon_s``: what was observed over as long a
    past where it covers all of it, else the prediction for the part it does not cover
    (weighted by the seconds each stands for). No prediction (no worker serves the
    model): none, whatever was observed."""
    if predicted <= 0 or observed is None or horizon_s <= 0:
        return predicted
    rate, window = observed
    f = min(1.0, window / horizon_s)
    return f * rate + (1 - f) * predicted
