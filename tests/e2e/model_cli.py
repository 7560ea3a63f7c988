"""What the model-lifecycle tests share: the ``gristmill models`` CLI run as an operator
would, and how long a registry change takes to reach every API instance."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable


def models_cli(
    env: dict[str, str], *args: str, check: bool = True, timeout_s: float = 600
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "gristmill", "models", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def switch_time(
    answered_by: Callable[[str], str], urls: list[str], version: str, since: float,
    limit_s: float = 5.0,
) -> float:  # fmt: skip
    """Seconds from ``since`` until every API instance in ``urls`` answers an unpinned
    request with ``version`` (``answered_by(url)``: the version that answered one
    request sent there; it asserts that nothing errs meanwhile)."""
    seen: dict[str, float] = {}
    while time.time() - since < limit_s and len(seen) < len(urls):
        for url in urls:
            if url not in seen and answered_by(url) == version:
                seen[url] = time.time() - since
        time.sleep(0.05)
    assert len(seen) == len(urls), f"not every instance answered {version} within {limit_s}s"
    return max(seen.values())
