"""Importing the client pulls in none of the server's heavy dependencies."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "confluent_kafka", "psycopg", "sqlalchemy", "orjson", "fastapi")


def test_import_pulls_in_no_server_dependency() -> None:
    code = (
        f"import sys, gristmill_client; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_declared_dependencies_are_httpx_only() -> None:
    import tomllib
    from pathlib import Path

    meta = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert [d.split(">")[0] for d in meta["project"]["dependencies"]] == ["httpx"]
