"""How a request the scheduler shed says so in its row, for the API to answer 503.

A sync request the scheduler drops before its deadline because the queue ahead says it
would start too late (scheduler/core/shedding.py, decision 62) is stored as ``expired``
with this error: the caller gets a 503 with the Retry-After it names, at once, not a 504
when the deadline comes. One place writes it and one reads it.
"""

from __future__ import annotations

import math
import re

_PREFIX = "shed: the queue ahead would outlast its deadline; retry after "
_PATTERN = re.compile(re.escape(_PREFIX) + r"(\d+) s$")


def shed_error(retry_after_s: float) -> str:
    """The row's error for a request shed with this Retry-After (whole seconds, >= 1)."""
    return f"{_PREFIX}{max(1, math.ceil(retry_after_s))} s"


def shed_retry_after_s(error: str | None) -> int | None:
    """The Retry-After of a shed request's error; None for any other error."""
    m = _PATTERN.match(error or "")
    return int(m.group(1)) if m else None
