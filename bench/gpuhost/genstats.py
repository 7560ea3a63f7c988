"""The generation scenario's statistics (bench/gpuhost/generation.py): pure functions of
what each streamed completion recorded, so they are tested without services."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Streamed:
    """One ``POST /v1/completions`` with ``stream: true``, as its caller saw it (times
    from ``time.monotonic``)."""

    sent: float
    max_tokens: int
    prompt_tokens: int
    status: int = 0  # the HTTP status; 0: no answer (the connection failed)
    error: str | None = None  # why it did not finish: "http 429", "stream expired", ...
    first: float | None = None  # the first chunk with text
    last: float | None = None  # the last chunk with text
    gaps: list[float] = field(default_factory=list)  # between chunks with text, s
    chunks: int = 0  # chunks with text (a token each, but for text held back)
    in_window: int = 0  # ... of them that arrived before the measured window closed
    usage_tokens: int | None = None  # completion_tokens from the stream's usage
    finish_reason: str | None = None
    done: float | None = None  # [DONE] read

    @property
    def completed(self) -> bool:
        return self.status == 200 and self.error is None and self.done is not None

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else self.chunks

    def chunk(self, at: float, window_end: float) -> None:
        """A chunk with text arrived at ``at``."""
        if self.first is None:
            self.first = at
        elif self.last is not None:
            self.gaps.append(at - self.last)
        self.last = at
        self.chunks += 1
        if at <= window_end:
            self.in_window += 1


def percentile(xs: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0-1) of ``xs``, linear between the closest ranks (numpy's
    default); None for no values."""
    if not xs:
        return None
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _ms(x: float | None) -> float | None:
    return None if x is None else round(1000 * x, 1)


def errors_by_kind(records: Iterable[Streamed]) -> dict[str, int]:
    """Requests that did not finish, by what ended them."""
    out = Counter(r.error or "unfinished" for r in records if not r.completed)
    return dict(sorted(out.items()))


def summarize(records: Sequence[Streamed], window_s: float) -> dict[str, Any]:
    """One mode at one stream count. Time to first token from the request's send to its
    first chunk with text; inter-token gaps between a request's chunks with text, all
    requests' pooled; tokens/s: chunks with text that arrived inside the window, over
    the window (a request still running when it closed counts what it had by then)."""
    done = [r for r in records if r.completed]
    ttft = [r.first - r.sent for r in records if r.first is not None]
    gaps = [g for r in records for g in r.gaps]
    asked = sum(r.max_tokens for r in done)
    made = sum(r.tokens for r in done)
    reasons = Counter(r.finish_reason or "none" for r in done)
    return {
        "requests": len(records),
        "completed": len(done),
        "errors": errors_by_kind(records),
        "ttft_p50_ms": _ms(percentile(ttft, 0.5)),
        "ttft_p95_ms": _ms(percentile(ttft, 0.95)),
        "itl_p50_ms": _ms(percentile(gaps, 0.5)),
        "itl_p95_ms": _ms(percentile(gaps, 0.95)),
        "tokens_per_s": round(sum(r.in_window for r in records) / window_s, 1),
        "output_tokens": made,
        # Output asked for against made, in the completed requests: EOS ends a greedy
        # answer before max_tokens (the API has no ignore_eos).
        "of_max_tokens": round(made / asked, 3) if asked else None,
        "finish_reasons": dict(sorted(reasons.items())),
        "prompt_tokens_mean": round(sum(r.prompt_tokens for r in records) / len(records), 1)
        if records
        else None,
    }


def ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Continuous against static at each stream count both ran: tokens/s and the p95
    time to first token (continuous over static)."""
    by = {(r["mode"], r["streams"]): r for r in rows}
    out = []
    for (mode, n), cont in sorted(by.items(), key=lambda x: x[0][1]):
        stat = by.get(("static", n))
        if mode != "continuous" or stat is None:
            continue

        def ratio(key: str, a: dict[str, Any] = cont, b: dict[str, Any] = stat) -> float | None:
            x, y = a.get(key), b.get(key)
            return round(x / y, 3) if x is not None and y else None

        out.append(
            {
                "streams": n,
                "tokens_per_s": ratio("tokens_per_s"),
                "ttft_p95": ratio("ttft_p95_ms"),
                "itl_p95": ratio("itl_p95_ms"),
            }
        )
    return out
