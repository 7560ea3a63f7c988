"""Where a process's time went, from py-spy's raw (collapsed-stack) output. Pure."""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

TOP = 25
_THREAD = re.compile(r"^thread \(\d+\): ")
_DIGITS = re.compile(r"\d+")


def py_spy() -> str:
    """The py-spy next to this interpreter (the project's virtualenv), else on PATH."""
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else "py-spy"


def _frame(f: str) -> str:
    """``func (file.py:12)`` -> ``func (file.py)``: lines of one function fold together."""
    return re.sub(r":\d+\)$", ")", f.strip())


def summarize_raw(text: str, top: int = TOP) -> dict[str, Any]:
    """Share of samples per thread (digits folded), per leaf function (self time) and
    per function anywhere on the stack (inclusive, counted once per stack)."""
    threads: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        thread = "?"
        if _THREAD.match(frames[0]):
            thread = _DIGITS.sub("#", _THREAD.sub("", frames[0]))
            frames = frames[1:]
        threads[thread] += n
        names = [_frame(f) for f in frames]
        if names:
            leaf[names[-1]] += n
        for name in set(names):
            inclusive[name] += n

    def share(c: Counter[str]) -> list[tuple[str, float]]:
        return [(k, round(v / total, 4)) for k, v in c.most_common(top)] if total else []

    return {
        "samples": total,
        "threads": share(threads),
        "self": share(leaf),
        "inclusive": share(inclusive),
    }
