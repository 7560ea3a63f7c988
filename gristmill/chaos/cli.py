"""``python -m gristmill.chaos`` (and ``gristmill chaos``): run the chaos suite.

Exit status 0 when nothing accepted was lost, duplicated or wrong and every fault
was recovered from; 1 otherwise.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

from gristmill.chaos.faults import KINDS, Fault
from gristmill.chaos.runner import ChaosConfig, run_chaos


def parse_args(argv: list[str] | None = None) -> ChaosConfig:
    p = argparse.ArgumentParser(
        prog="gristmill chaos",
        description="Start a local Gristmill (3 Kafka brokers, PostgreSQL, 2 APIs, 2 schedulers),"
        " load it, inject random faults, and audit PostgreSQL against what clients were told.",
    )
    p.add_argument("--rounds", type=int, default=20, help="faults to inject (default 20)")
    p.add_argument("--rate", type=float, default=40.0, help="requests per second (default 40)")
    p.add_argument("--seed", type=int, default=None, help="repeat a run's fault sequence")
    p.add_argument(
        "--faults",
        default="",
        help=f"comma-separated subset of {','.join(KINDS)} (default: all)",
    )
    p.add_argument("--calm", type=float, default=3.0, help="seconds of calm after each recovery")
    p.add_argument("--timeout-ms", type=int, default=10_000, help="each request's timeout_ms")
    p.add_argument("--workdir", type=Path, default=Path(".gristmill/chaos"))
    p.add_argument("--no-jobs", action="store_true", help="sync requests only")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--hold", action="store_true", help="keep the system up after the audit")
    p.add_argument(
        "--no-partitions",
        action="store_true",
        help="no network namespaces (by default a scheduler and an API run in their own, "
        "for the cut-* faults, where the machine allows it)",
    )
    a = p.parse_args(argv)
    kinds = tuple(k for k in a.faults.split(",") if k)
    unknown = set(kinds) - set(KINDS)
    if unknown:
        p.error(f"unknown fault kinds: {', '.join(sorted(unknown))}")
    return ChaosConfig(
        rounds=a.rounds,
        rate=a.rate,
        seed=a.seed,
        kinds=kinds,
        workdir=a.workdir,
        calm_s=a.calm,
        timeout_ms=a.timeout_ms,
        jobs=False if a.no_jobs else None,
        progress=not a.no_progress,
        hold=a.hold,
        partitions=False if a.no_partitions else None,
    )


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds through the context managers: everything is stopped


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    from tqdm import tqdm

    bar = tqdm(
        total=cfg.rounds, desc="chaos", unit="fault", disable=not cfg.progress, file=sys.stderr
    )

    def on_round(f: Fault) -> None:
        rec = "never" if f.recovery_s is None else f"{f.recovery_s:.1f}s"
        bar.set_postfix_str(f"{f.kind} {f.target}: recovered in {rec}")
        bar.update(1)

    try:
        report = run_chaos(cfg, on_round=on_round)
    except KeyboardInterrupt:
        print("interrupted; everything started was stopped", file=sys.stderr)
        return 130
    finally:
        bar.close()
    print(report.text())
    return 0 if report.ok else 1
