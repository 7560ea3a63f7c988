"""``Prefer`` (RFC 7240): how long a caller will wait for its answer and what it takes
instead. Read by the embeddings door and, for a flex request on any door, by the
acceptance pipeline (decision 66). Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

_WAIT = re.compile(r"^\s*wait\s*=\s*\"?([0-9]{1,9})\"?\s*$", re.IGNORECASE)


# Gristmill's own preference: at the deadline, the inputs done so far (decision 63).
PARTIAL_RESULTS = "partial-results"


@dataclass(frozen=True)
class Prefer:
    respond_async: bool = False
    wait_s: int | None = None  # how long the client will wait for the answer (seconds)
    partial: bool = False  # partial-results: a 200 with what is done at the deadline


NO_PREFERENCE = Prefer()


def parse_prefer(values: list[str]) -> Prefer:
    """``Prefer: respond-async, wait=N`` and ``partial-results`` from every Prefer
    header. Preferences we do not know are ignored, as RFC 7240 asks; a malformed
    ``wait`` too."""
    respond_async, wait, partial = False, None, False
    for header in values:
        for pref in header.split(","):
            token = pref.split(";")[0].strip()
            if token.lower() == "respond-async":
                respond_async = True
            elif token.lower() == PARTIAL_RESULTS:
                partial = True
            elif (m := _WAIT.match(token)) is not None:
                wait = int(m.group(1))
    return Prefer(respond_async, wait, partial)
