"""Peer (b): Ray Serve with ``@serve.batch`` over the same ``sim`` model.

Runs in the peers' own virtualenv (``.venv-peers``, see ``bench.peers.setup``) with the repo
on PYTHONPATH. Two replicas, one batch at a time each (``max_concurrent_batches=1``), the
model call in a thread so a replica keeps collecting the next batch meanwhile. The batch
knobs come in as ``user_config``, so the sweep can retune them without restarting replicas:
after "READY" on stdout, each stdin line ``config <max_batch_size> <batch_wait_timeout_s>``
is applied and answered with "OK"; EOF or ``quit`` shuts Ray down.

    python -m bench.peers.ray_app --port 8001 --stats-dir /tmp/x --max-lifetime-s 3600
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from typing import Any

import ray
from ray import serve
from starlette.requests import Request

from bench.peers.stats import BusyMeter
from core.models.sim import SimSpec
from workers.models.sim import SimModel

MAX_ONGOING = 1000  # per replica: lets a queue build beyond one batch, as in the others


@serve.deployment(
    num_replicas=2, max_ongoing_requests=MAX_ONGOING, ray_actor_options={"num_cpus": 0}
)
class SimBatcher:
    def __init__(self, stats_dir: str, batch_ms: float) -> None:
        self.model = SimModel(
            SimSpec(name="sim", version="1", max_batch_size=100, batch_ms=batch_ms)
        )
        self.meter = BusyMeter(stats_dir)

    def reconfigure(self, cfg: dict[str, Any]) -> None:
        self.run_batch.set_max_batch_size(int(cfg["max_batch_size"]))
        self.run_batch.set_batch_wait_timeout_s(float(cfg["batch_wait_timeout_s"]))

    @serve.batch(max_batch_size=100, batch_wait_timeout_s=0.05, max_concurrent_batches=1)
    async def run_batch(self, inputs: list[str]) -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        outs = await asyncio.to_thread(self.model.predict, inputs, {})
        self.meter.record(len(inputs), time.perf_counter() - t0)
        return [{"output": o, "model": "sim", "batch_size": len(inputs)} for o in outs]

    async def __call__(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        return await self.run_batch(body["input"])


def deploy(stats_dir: str, batch_ms: float, max_batch: int, wait_s: float) -> None:
    cfg = {"max_batch_size": max_batch, "batch_wait_timeout_s": wait_s}
    deployment: Any = SimBatcher  # a serve.Deployment at run time; stubs see the class
    app = deployment.options(user_config=cfg).bind(stats_dir, batch_ms)
    serve.run(app, name="sim", route_prefix="/v1/infer")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--stats-dir", required=True)
    ap.add_argument("--max-batch", type=int, default=100)
    ap.add_argument("--wait-s", type=float, default=0.05)
    ap.add_argument("--max-lifetime-s", type=int, default=3600)
    args = ap.parse_args()
    batch_ms = float(os.environ.get("GRISTMILL_SIM_BATCH_MS", "100"))

    def bail(*_: object) -> None:
        raise SystemExit(0)

    # Never outlive the sweep: stop on SIGTERM and after a fixed lifetime.
    signal.signal(signal.SIGTERM, bail)
    signal.signal(signal.SIGALRM, bail)
    signal.alarm(args.max_lifetime_s)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        deploy(args.stats_dir, batch_ms, args.max_batch, args.wait_s)
        print("READY", flush=True)
        for line in sys.stdin:
            parts = line.split()
            if not parts or parts[0] == "quit":
                break
            if parts[0] == "config":
                deploy(args.stats_dir, batch_ms, int(parts[1]), float(parts[2]))
                print("OK", flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
