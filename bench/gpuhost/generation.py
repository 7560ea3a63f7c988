"""The ``generation`` scenario of the whole-system run (issue 28, item 8): gristmill-lm
through ``POST /v1/completions`` with ``stream: true``, closed loop at each of
``--gen-streams`` for ``--gen-seconds``, continuous against static batching through the
whole system in the same call.

The service serves continuous batching only; static batching is the benchmark's own
(bench/generation/static.py, the policy the engine-level comparison of
docs/bench/generation.md uses), put into the schedulers by restarting ``gristmill host``
with bench/gpuhost/static_batching/ first on ``PYTHONPATH`` (its ``sitecustomize``).
Kafka, PostgreSQL, the topics and the tenants stay; the API processes, schedulers and
worker start again for the other mode, and the first stream count of each mode follows a
short warm-up of its own. Requests: ``bench/gpuhost/genload.py`` (seeded log-normal
prompt and output lengths, temperature 0); statistics: ``bench/gpuhost/genstats.py``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from bench.gpuhost.genload import LM, Mix, closed_loop, prompts
from bench.gpuhost.genstats import ratios, summarize
from bench.gpuhost.measure import GpuBusy, cpu_delta
from bench.gpuhost.stack import Stack, log

REPO = Path(__file__).resolve().parents[2]
HOOK = Path(__file__).resolve().with_name("static_batching")
MODES = ("continuous", "static")


def mode_env(mode: str, base: dict[str, str]) -> dict[str, str]:
    """What ``gristmill host`` is restarted with to serve ``mode``."""
    if mode not in MODES:
        raise ValueError(f"--gen-modes: {mode!r} is not one of {MODES}")
    if mode == "continuous":
        return {"GMBENCH_LM_BATCHING": mode}
    path = [str(HOOK), str(REPO), *filter(None, base.get("PYTHONPATH", "").split(os.pathsep))]
    return {"GMBENCH_LM_BATCHING": mode, "PYTHONPATH": os.pathsep.join(path)}


def stack_env(args: argparse.Namespace) -> dict[str, str]:
    """Settings the scenario starts the stack with: the enterprise key (the streams'
    caller) may hold twice the most streams asked for at once, so the tier's stream cap
    (256 by default, shared by the instance's API processes) is not what a run measures
    when a stream's next request races its last one's release."""
    most = max(int(x) for x in args.gen_streams.split(","))
    cap = max(256, 2 * most)
    return {
        "GRISTMILL_TIER_MAX_STREAMS": json.dumps({"free": 8, "paid": 64, "enterprise": cap}),
        "GRISTMILL_MAX_STREAMS": str(max(1000, cap)),
    }


def wait_generating(stack: Stack, timeout_s: float = 300.0) -> float:
    """Seconds until a short completion is answered (the worker loads the LM, the
    schedulers' consumers join)."""
    t0 = time.time()
    last = ""
    while time.time() < t0 + timeout_s:
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.post(
                f"{stack.url}/v1/completions",
                headers=stack.headers(),
                json={"model": LM, "prompt": "warm up", "max_tokens": 4, "temperature": 0},
                timeout=60,
            )
            if r.status_code == 200:
                return round(time.time() - t0, 1)
            last = r.text[:200]
        time.sleep(1)
    raise RuntimeError(f"{LM} not generating in time: {last}")


def generation_scenario(stack: Stack, args: argparse.Namespace, gpu: GpuBusy) -> dict[str, Any]:
    streams = [int(x) for x in args.gen_streams.split(",")]
    modes = args.gen_modes.split(",")
    for m in modes:
        mode_env(m, {})  # an unknown mode fails before anything runs
    pool = prompts(args.gen_prompts, seed=args.gen_seed)
    out: dict[str, Any] = {
        "mix": asdict(Mix()),
        "pool": {
            "prompts": len(pool),
            "prompt_tokens_mean": round(statistics.fmean(p.tokens for p in pool), 1),
            "max_tokens_mean": round(statistics.fmean(p.max_tokens for p in pool), 1),
        },
        "seconds": args.gen_seconds,
        "restart_s": {},
        "rows": [],
    }
    log(f"generation: {out['pool']}")
    serving = "continuous"  # what the stack was started with
    for mode in modes:
        if mode != serving:
            out["restart_s"][mode] = stack.restart_host(mode_env(mode, stack.env))
            serving = mode
        out.setdefault("ready_s", {})[mode] = wait_generating(stack)
        if args.gen_warmup > 0:  # the first shapes, the connections; not recorded
            closed_loop(stack.url, stack.headers(), pool, min(streams), args.gen_warmup)
        for n in streams:
            cpu = stack.cpu()
            a, t0 = cpu.sample(), time.time()
            records, m0, m1 = closed_loop(stack.url, stack.headers(), pool, n, args.gen_seconds)
            b, t1 = cpu.sample(), time.time()
            row = {
                "mode": mode,
                "streams": n,
                **summarize(records, m1 - m0),
                "drain_s": round(t1 - t0 - args.gen_seconds, 1),
                "gpu_busy": gpu.mean(t0, t0 + args.gen_seconds),
                "cpu_cores": cpu_delta(a, b, len(records))["cores"],
            }
            time.sleep(1.5)  # the API writes its refusal counts about once a second
            row["refused"] = stack.refusals(t0, time.time())
            out["rows"].append(row)
            log(
                f"generation {mode} x{n}: {row['completed']}/{row['requests']} done, "
                f"errors {row['errors']}, TTFT p50/p95 {row['ttft_p50_ms']}/"
                f"{row['ttft_p95_ms']} ms, ITL p50/p95 {row['itl_p50_ms']}/{row['itl_p95_ms']} "
                f"ms, {row['tokens_per_s']} tokens/s, GPU {row['gpu_busy']}"
            )
            time.sleep(1)
    out["continuous_over_static"] = ratios(out["rows"])
    log(f"generation: continuous/static {out['continuous_over_static']}")
    return out
