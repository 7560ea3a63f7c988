"""``gristmill models ...`` run as an operator would, in a test system's environment."""

from __future__ import annotations

import subprocess
import sys


def models_cli(
    env: dict[str, str], *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [sys.executable, "-m", "gristmill", "models", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r
