"""The API process imports no model runtime: torch stays in the workers."""

from __future__ import annotations

import os
import subprocess
import sys

RUNTIME = ("torch", "safetensors", "transformers", "workers")


def test_importing_the_app_pulls_in_no_model_runtime() -> None:
    code = (
        "import sys, ingest.app, ingest.main; "
        f"print(','.join(m for m in {RUNTIME!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_app_limits_malloc_arenas_however_it_is_started() -> None:
    """uvicorn run directly (the tests, `gristmill dev`) gets what `gristmill api` gets;
    an operator's own setting stays."""
    code = "import os, ingest.main; print(os.environ['MALLOC_ARENA_MAX'])"
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "2", out.stderr[-500:]
    env["MALLOC_ARENA_MAX"] = "4"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "4", out.stderr[-500:]
