"""``python -m workers``: run one worker process that connects to a scheduler."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from gristmill.config import load_settings
from workers.process import serve


def main() -> None:
    parser = argparse.ArgumentParser(prog="gristmill-worker")
    parser.add_argument("--socket", required=True, help="the scheduler's worker socket")
    parser.add_argument("--models", default="sim", help="comma-separated name[@version] list")
    parser.add_argument("--worker-id", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s")
    key_hex = os.environ.get("GRISTMILL_WORKER_AUTHKEY")
    # A worker started by hand reads the key the scheduler left beside its socket.
    authkey = (
        bytes.fromhex(key_hex)
        if key_hex
        else (Path(args.socket).parent / "worker.key").read_bytes()
    )
    serve(
        load_settings(),
        args.socket,
        authkey,
        [m for m in args.models.split(",") if m],
        args.worker_id,
    )


if __name__ == "__main__":
    main()
