"""``python -m workers``: run one worker process that connects to its scheduler(s)."""

from __future__ import annotations

import argparse
import logging

from core import redact
from core.config import load_settings
from workers.process import authkey_for, serve


def main() -> None:
    parser = argparse.ArgumentParser(prog="gristmill-worker")
    parser.add_argument(
        "--socket",
        required=True,
        action="append",
        help="a scheduler's worker socket; repeat it to serve several schedulers of this host",
    )
    parser.add_argument(
        "--models", default="sim", help="comma-separated name[@version] list it may serve"
    )
    parser.add_argument("--worker-id", default=None)
    parser.add_argument(
        "--no-preload",
        action="store_true",
        help="load nothing before connecting: the schedulers say which versions to load "
        "(the registry's); by default the built-in versions of --models are loaded first",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s")
    redact.install()
    settings = load_settings()
    serve(
        settings,
        [(path, authkey_for(settings, path)) for path in args.socket],
        [m for m in args.models.split(",") if m],
        args.worker_id,
        preload=not args.no_preload,
    )


if __name__ == "__main__":
    main()
