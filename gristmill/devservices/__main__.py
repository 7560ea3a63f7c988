"""``python -m gristmill.devservices up --dir .gristmill/services``: run Kafka and PostgreSQL
in the foreground until Ctrl-C or SIGTERM, then stop both cleanly (another Ctrl-C half a
second or more later: at once; if this process is killed, the lifeline stops both)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from core.redact import write_private
from gristmill.devservices.kafka import KafkaCluster
from gristmill.devservices.lifeline import lifeline
from gristmill.devservices.postgres import PostgresServer
from gristmill.devservices.stopsignals import SIGNALS, StopSignals


def _up(args: argparse.Namespace) -> int:
    base = Path(args.dir).resolve()
    base.mkdir(parents=True, exist_ok=True)
    stop = StopSignals(on_now=lifeline().kill_now)
    # Handlers go in before starting anything so a Ctrl-C during startup still cleans up.
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    stop.install()
    try:
        with contextlib.ExitStack() as stack:
            started = time.monotonic()
            kafka = KafkaCluster(
                base / "kafka", n_brokers=args.kafka_nodes, partitions=args.partitions
            )
            stack.callback(kafka.stop)
            kafka.start()
            postgres = PostgresServer(base / "postgres", port=args.pg_port, fast=args.fast)
            stack.callback(postgres.stop)
            postgres.start()
            lines = [f"KAFKA_BOOTSTRAP={kafka.bootstrap}", f"DATABASE_URL={postgres.url}"]
            # Also leave them in a file so other shells can `source` it.
            write_private(base / "env", "".join(f"{line}\n" for line in lines))
            print("\n".join(lines), flush=True)
            print(
                f"# up in {time.monotonic() - started:.1f}s; logs under {base}; Ctrl-C to stop",
                file=sys.stderr,
                flush=True,
            )
            while not stop.orderly.wait(1.0):
                pass
            print("# stopping...", file=sys.stderr, flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gristmill.devservices",
        description="Throwaway local Kafka and PostgreSQL for development.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start Kafka and PostgreSQL and wait for Ctrl-C/SIGTERM")
    up.add_argument("--dir", default=".gristmill/services", help="work directory for both")
    up.add_argument("--kafka-nodes", type=int, default=1, help="Kafka nodes (1 or 3)")
    up.add_argument("--partitions", type=int, default=3, help="Kafka num.partitions")
    up.add_argument("--pg-port", type=int, default=None, help="PostgreSQL port (default: free)")
    up.add_argument(
        "--fast", action="store_true", help="PostgreSQL with fsync/synchronous_commit off"
    )
    args = parser.parse_args(argv)
    if args.command == "up":
        return _up(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
