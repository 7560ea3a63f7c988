"""Cross-check with vegeta, an independent open-loop load generator written in Go.

Installed by the bench's set-up step (``go install``) into ``$(go env GOPATH)/bin``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

VEGETA_MODULE = "github.com/tsenart/vegeta/v12@v12.13.0"


def vegeta_path() -> str | None:
    found = shutil.which("vegeta")
    if found:
        return found
    gopath = Path.home() / "go"
    if shutil.which("go"):
        out = subprocess.run(["go", "env", "GOPATH"], capture_output=True, text=True, timeout=60)
        gopath = Path(out.stdout.strip() or gopath)
    candidate = gopath / "bin" / "vegeta"
    return str(candidate) if candidate.exists() else None


def install_vegeta() -> str | None:
    if vegeta_path() or not shutil.which("go"):
        return vegeta_path()
    subprocess.run(["go", "install", VEGETA_MODULE], check=True, timeout=900)
    return vegeta_path()


def run_vegeta(
    url: str, headers: dict[str, str], body: dict[str, Any], rate: float, duration_s: float
) -> dict[str, Any]:
    """Attack ``url`` at ``rate``/s; the summary uses the sweep's keys (ms, req/s)."""
    exe = vegeta_path()
    if exe is None:
        raise RuntimeError("vegeta not found: run python -m bench.sweep --setup-peers")
    with tempfile.TemporaryDirectory(prefix="gmb-vegeta-") as tmp:
        body_file = Path(tmp) / "body.json"
        body_file.write_text(json.dumps(body))
        lines = [f"POST {url}", "Content-Type: application/json"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        (Path(tmp) / "targets.txt").write_text("\n".join([*lines, f"@{body_file}", ""]))
        results = Path(tmp) / "results.bin"
        attack = [exe, "attack", f"-targets={tmp}/targets.txt", f"-rate={rate:g}/1s"]
        attack += [f"-duration={duration_s:g}s", "-timeout=15s", f"-output={results}"]
        subprocess.run(attack, check=True, timeout=duration_s + 60)
        rep = subprocess.run(
            [exe, "report", "-type=json", str(results)],
            check=True, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    r = json.loads(rep.stdout)
    lat = r["latencies"]
    ok = r["status_codes"].get("200", 0)
    return {
        "tool": "vegeta",
        "offered_rps": rate,
        "requests": r["requests"],
        "achieved_rps": round(ok / (r["duration"] / 1e9 + r["wait"] / 1e9), 1),
        "p50_ms": round(lat["50th"] / 1e6, 1),
        "p95_ms": round(lat["95th"] / 1e6, 1),
        "p99_ms": round(lat["99th"] / 1e6, 1),
        "max_ms": round(lat["max"] / 1e6, 1),
        "statuses": r["status_codes"],
    }
