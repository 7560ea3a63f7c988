"""Create the peers' own virtualenv (``.venv-peers``) and install them from PyPI.

Kept apart from ``.venv`` so Ray's dependency pins never touch the project's install.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PEERS_VENV = REPO / ".venv-peers"
REQUIREMENTS = REPO / "bench" / "requirements-peers.txt"


def peers_python() -> Path:
    return PEERS_VENV / "bin" / "python"


def peers_ready() -> bool:
    py = peers_python()
    if not py.exists():
        return False
    probe = subprocess.run([str(py), "-c", "import ray.serve"], capture_output=True, timeout=120)
    return probe.returncode == 0


def setup_peers() -> None:
    if peers_ready():
        print(f"peers already installed in {PEERS_VENV}", file=sys.stderr)
        return
    print(f"creating {PEERS_VENV} and installing {REQUIREMENTS.name} ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True, timeout=300)
    pip = [str(peers_python()), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True, timeout=600)
    subprocess.run([*pip, "-r", str(REQUIREMENTS)], check=True, timeout=1800)
    _exclude_from_git()


def _exclude_from_git() -> None:
    # The venv lives in the work tree; keep it out of `git status` without editing .gitignore.
    exclude = REPO / ".git" / "info" / "exclude"
    if exclude.parent.is_dir():
        text = exclude.read_text() if exclude.exists() else ""
        if ".venv-peers/" not in text.split():
            exclude.write_text(text + ("" if text.endswith("\n") or not text else "\n"))
            with exclude.open("a") as f:
                f.write(".venv-peers/\n")
