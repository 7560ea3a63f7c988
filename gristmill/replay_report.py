"""How a candidate version compares with recorded traffic. Pure.

Each recorded request and the candidate's answer to the same input make a ``Pair``.
Agreement is exact equality for deterministic outputs, and cosine similarity for
embeddings (outputs that are equal-length lists of numbers): a pair agrees when its
cosine reaches ``min_cosine``. Generated text (outputs with a ``text``, decision 67)
agrees when the texts are equal (both run at temperature 0); beside that exact-match
rate the report gives a token-level similarity, one minus the edit distance between the
two token sequences over the longer one's length, so a candidate that differs in a
word scores near 1 and one that says something else near 0.

Per tenant tier and overall the report gives agreement, the error rates and their
delta, and the model latency (the compute time of the batch each request ran in) at
p50 and p95 with its change. A replay passes when enough pairs agree, the candidate
fails no more often than allowed, and every request was answered.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

EXACT = "exact"
COSINE = "cosine"
TEXT = "text"
AUTO = "auto"
MODES = (AUTO, EXACT, COSINE, TEXT)

Tokenize = Callable[[str], Sequence[Any]]


@dataclass(frozen=True)
class Thresholds:
    # Share of answered pairs that must agree.
    min_agreement: float = 0.99
    # Cosine at or above which two embeddings agree: 0.99 separates a re-quantized
    # model (at least 0.999999 measured on the fp16 weights of all-minilm-l6-v2,
    # docs/models.md) from a different one.
    min_cosine: float = 0.99
    # How much more often the candidate may fail than the recorded version did.
    max_error_delta: float = 0.01


@dataclass(frozen=True)
class Pair:
    tier: str
    original_ok: bool
    original_output: Any
    original_ms: float | None  # compute ms of the batch it ran in
    candidate_ok: bool | None  # None: no answer within the replay's time
    candidate_output: Any = None
    candidate_ms: float | None = None


def is_vector(x: Any) -> bool:
    return (
        isinstance(x, list)
        and bool(x)
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in x)
    )


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):
        return float("nan")
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return dot / (na * nb)


def is_text(x: Any) -> bool:
    return isinstance(x, dict) and isinstance(x.get("text"), str)


def edit_distance(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Levenshtein distance: insertions, deletions and substitutions of one item."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def token_similarity(a: Sequence[Any], b: Sequence[Any]) -> float:
    """1 - edit distance / the longer length: 1 for equal sequences (two empty ones
    too), 0 for sequences with nothing in common position by position."""
    longest = max(len(a), len(b))
    return 1.0 if longest == 0 else 1.0 - edit_distance(a, b) / longest


def percentile(xs: Sequence[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


@dataclass
class Group:
    """One tier's (or everyone's) numbers."""

    name: str
    items: int = 0
    answered: int = 0  # the candidate answered (succeeded or failed)
    compared: int = 0  # both succeeded
    agreed: int = 0
    cosines: list[float] = field(default_factory=list)
    similarities: list[float] = field(default_factory=list)  # token-level, text mode
    original_errors: int = 0
    candidate_errors: int = 0
    original_ms: list[float] = field(default_factory=list)
    candidate_ms: list[float] = field(default_factory=list)

    @property
    def agreement(self) -> float:
        return self.agreed / self.compared if self.compared else float("nan")

    @property
    def original_error_rate(self) -> float:
        return self.original_errors / self.items if self.items else float("nan")

    @property
    def candidate_error_rate(self) -> float:
        return self.candidate_errors / self.answered if self.answered else float("nan")

    @property
    def error_delta(self) -> float:
        return self.candidate_error_rate - self.original_error_rate

    def latency(self, q: float) -> tuple[float, float]:
        return percentile(self.original_ms, q), percentile(self.candidate_ms, q)

    def row(self) -> dict[str, Any]:
        p50 = self.latency(50)
        p95 = self.latency(95)
        return {
            "tier": self.name,
            "items": self.items,
            "answered": self.answered,
            "compared": self.compared,
            "agreement": self.agreement,
            "mean_cosine": sum(self.cosines) / len(self.cosines) if self.cosines else None,
            "min_cosine": min(self.cosines) if self.cosines else None,
            "mean_token_similarity": _mean(self.similarities),
            "min_token_similarity": min(self.similarities) if self.similarities else None,
            "original_error_rate": self.original_error_rate,
            "candidate_error_rate": self.candidate_error_rate,
            "error_delta": self.error_delta,
            "original_p50_ms": p50[0],
            "candidate_p50_ms": p50[1],
            "original_p95_ms": p95[0],
            "candidate_p95_ms": p95[1],
            "p95_change": (p95[1] - p95[0]) / p95[0] if p95[0] and p95[0] > 0 else float("nan"),
        }


@dataclass(frozen=True)
class Report:
    mode: str
    overall: Group
    tiers: list[Group]
    passed: bool
    reasons: list[str]
    thresholds: Thresholds

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "passed": self.passed,
            "reasons": self.reasons,
            "thresholds": vars(self.thresholds),
            "overall": self.overall.row(),
            "tiers": [g.row() for g in self.tiers],
        }


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def mode_for(pairs: Iterable[Pair], requested: str = AUTO) -> str:
    if requested != AUTO:
        return requested
    for p in pairs:
        if p.original_ok and p.candidate_ok:
            if is_text(p.original_output) and is_text(p.candidate_output):
                return TEXT
            both = is_vector(p.original_output) and is_vector(p.candidate_output)
            return COSINE if both else EXACT
    return EXACT


def compare(
    pairs: Sequence[Pair],
    thresholds: Thresholds = Thresholds(),
    mode: str = AUTO,
    tokenize: Tokenize = str.split,
) -> Report:
    """``tokenize``: the tokens text mode compares (the model's own tokenizer in a
    replay; words by default)."""
    mode = mode_for(pairs, mode)
    overall = Group("all")
    tiers: dict[str, Group] = {}
    for p in pairs:
        sim = _similarity(p, tokenize) if mode == TEXT else None
        for g in (overall, tiers.setdefault(p.tier, Group(p.tier))):
            _add(g, p, mode, thresholds, sim)
    reasons: list[str] = []
    if not pairs:
        reasons.append("no recorded requests to replay")
    missing = overall.items - overall.answered
    if missing:
        reasons.append(f"{missing} of {overall.items} requests got no answer in time")
    if overall.compared and overall.agreement < thresholds.min_agreement:
        reasons.append(f"agreement {overall.agreement:.2%} is below {thresholds.min_agreement:.2%}")
    if overall.answered and overall.error_delta > thresholds.max_error_delta:
        reasons.append(
            f"the candidate fails {overall.candidate_error_rate:.2%} of requests, "
            f"{overall.error_delta:+.2%} against the recorded version "
            f"(at most {thresholds.max_error_delta:+.2%})"
        )
    ordered = [tiers[t] for t in sorted(tiers, key=_tier_order)]
    return Report(mode, overall, ordered, not reasons, reasons, thresholds)


def _tier_order(t: str) -> tuple[int, str]:
    known = ["enterprise", "paid", "free"]
    return (known.index(t), t) if t in known else (len(known), t)


def _text(x: Any) -> str | None:
    return x["text"] if is_text(x) else None


def _similarity(p: Pair, tokenize: Tokenize) -> float | None:
    a, b = _text(p.original_output), _text(p.candidate_output)
    if not (p.original_ok and p.candidate_ok) or a is None or b is None:
        return None
    return token_similarity(tokenize(a), tokenize(b))


def _add(g: Group, p: Pair, mode: str, t: Thresholds, sim: float | None = None) -> None:
    g.items += 1
    if not p.original_ok:
        g.original_errors += 1
    if p.original_ms is not None:
        g.original_ms.append(p.original_ms)
    if p.candidate_ok is None:
        return
    g.answered += 1
    if p.candidate_ms is not None:
        g.candidate_ms.append(p.candidate_ms)
    if not p.candidate_ok:
        g.candidate_errors += 1
        return
    if not p.original_ok:
        return
    g.compared += 1
    if mode == COSINE:
        c = (
            cosine(p.original_output, p.candidate_output)
            if is_vector(p.original_output) and is_vector(p.candidate_output)
            else float("nan")
        )
        if not math.isnan(c):
            g.cosines.append(c)
        g.agreed += int(c >= t.min_cosine)
    elif mode == TEXT:
        a, b = _text(p.original_output), _text(p.candidate_output)
        g.agreed += int(a is not None and a == b)
        if sim is not None:
            g.similarities.append(sim)
    else:
        g.agreed += int(p.original_output == p.candidate_output)


def render(report: Report, name: str, candidate: str) -> str:
    """The report as a plain-text table."""

    def pct(x: float | None) -> str:
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2%}"

    def ms(x: float) -> str:
        return "-" if math.isnan(x) else f"{x:.1f}"

    second = "tok sim" if report.mode == TEXT else "cos min"
    head = (
        f"{'tier':<11}{'items':>7}{'answered':>10}{'agree':>9}{second:>9}"
        f"{'err was':>9}{'err now':>9}{'p50 ms':>15}{'p95 ms':>15}{'p95 Δ':>8}"
    )
    lines = [
        f"Replay of {name} against {candidate} ({report.mode} comparison)",
        "",
        head,
        "-" * len(head),
    ]
    for g in [*report.tiers, report.overall]:
        r = g.row()
        lo50, c50 = g.latency(50)
        lo95, c95 = g.latency(95)
        value = r["mean_token_similarity"] if report.mode == TEXT else r["min_cosine"]
        cos_min = "-" if value is None else f"{value:.4f}"
        lines.append(
            f"{g.name:<11}{g.items:>7}{g.answered:>10}{pct(r['agreement']):>9}"
            f"{cos_min:>9}"
            f"{pct(r['original_error_rate']):>9}{pct(r['candidate_error_rate']):>9}"
            f"{ms(lo50) + ' > ' + ms(c50):>15}{ms(lo95) + ' > ' + ms(c95):>15}"
            f"{pct(r['p95_change']):>8}"
        )
    lines.append("")
    lines.append("PASSED" if report.passed else "FAILED: " + "; ".join(report.reasons))
    return "\n".join(lines)
