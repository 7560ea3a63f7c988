"""The image's HEALTHCHECK: is the Gristmill process in this container healthy?

One image runs every process, so this reads what PID 1 runs (tini -- gristmill <command>):
  api        GET /healthz on its port answers 200
  scheduler  its worker socket exists (it is created once the scheduler runs and removed
             when it stops)
  ledger     GET /metrics on GRISTMILL_LEDGER_METRICS_PORT (9465) answers 200 (0: no port,
             healthy while it runs)
  anything else (worker, migrate, doctor): healthy while it runs.
Standard library only; exit 0 healthy, 1 not.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path


def command_line(pid: int = 1) -> list[str]:
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def option(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def answers(process: str, url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return 0 if r.status == 200 else 1
    except OSError as exc:
        print(f"{process} not answering at {url}: {exc}", file=sys.stderr)
        return 1


def main() -> int:
    return check(command_line())


def check(argv: list[str]) -> int:
    # After "gristmill" (the entrypoint script may appear as .../bin/gristmill).
    rest = next((argv[i + 1 :] for i, a in enumerate(argv) if a.endswith("gristmill")), [])
    command = rest[0] if rest else ""
    if command == "api":
        port = option(rest, "--port") or os.environ.get("GRISTMILL_API_PORT", "8000")
        return answers("api", f"http://127.0.0.1:{port}/healthz")
    if command == "ledger":
        port = os.environ.get("GRISTMILL_LEDGER_METRICS_PORT", "9465")
        return answers("ledger", f"http://127.0.0.1:{port}/metrics") if port != "0" else 0
    if command == "scheduler":
        sock = Path(option(rest, "--socket-dir") or ".gristmill/run") / "workers.sock"
        if not sock.is_socket():
            print(f"scheduler socket {sock} missing", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
