"""The API process imports no model runtime: torch stays in the workers."""

from __future__ import annotations

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
