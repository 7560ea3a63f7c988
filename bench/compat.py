"""What the OpenAI-compatible embeddings route costs the API, against ``/v1/infer``.

One system (its own Kafka and PostgreSQL, one API process, one scheduler with ``sim``
workers in vector mode: each answer a float32 vector of ``--dim`` values, the
embedding model's shape, at no compute cost), driven open-loop at the same rate by:

* ``infer``: ``POST /v1/infer`` through aiohttp (the native API; floats as JSON);
* ``sdk_base64``: ``embeddings.create`` through the official ``openai`` SDK
  (``AsyncOpenAI``), its default ``encoding_format="base64"``;
* ``sdk_float``: the same with ``encoding_format="float"``;
* ``embeddings_raw``: ``POST /v1/embeddings`` (base64) through aiohttp, the route
  without the SDK's client cost on the shared machine.

For each: the API process's CPU seconds per answered item (user + system, from
/proc, over the run), latency percentiles and the answer's size on the wire. The
scheduler's and workers' CPU is the same path for every route and is not counted.

    flock /tmp/gristmill-heavy.lock .venv/bin/python -m bench.compat --rate 100 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil

from bench.openloop import percentile
from bench.system import sim_system
from gristmill.devservices.stack import System


def api_cpu_s(system: System) -> float:
    """CPU seconds (user + system) of the API process and any children it runs."""
    p = psutil.Process(system.procs["api"].pid)
    total = 0.0
    for q in [p, *p.children(recursive=True)]:
        t = q.cpu_times()
        total += t.user + t.system
    return total


async def open_loop(
    rate: float, count: int, call: Callable[[int], Awaitable[int]]
) -> tuple[list[float], list[int], float]:
    """Start call ``i`` at ``i / rate`` s whatever earlier calls are doing; latencies
    (ms) from the intended start, answer sizes, and the wall time."""
    latencies: list[float] = []
    sizes: list[int] = []
    start = time.perf_counter()

    async def one(i: int) -> None:
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        size = await call(i)
        latencies.append((time.perf_counter() - start - i / rate) * 1000)
        sizes.append(size)

    await asyncio.gather(*(one(i) for i in range(count)))
    return latencies, sizes, time.perf_counter() - start


async def measured(
    system: System, rate: float, count: int, call: Callable[[int], Awaitable[int]]
) -> tuple[list[float], list[int], float, tuple[float, float]]:
    """``open_loop``'s run and the API's CPU over it: (CPU s, elapsed s)."""
    cpu0, t0 = api_cpu_s(system), time.time()
    lat, sizes, wall = await open_loop(rate, count, call)
    return lat, sizes, wall, (api_cpu_s(system) - cpu0, time.time() - t0)


def pct(xs: list[float], q: float) -> float:
    return round(percentile(xs, q), 1)


async def run_variant(
    system: System, variant: str, rate: float, seconds: float, dim: int
) -> dict[str, Any]:
    import openai

    count = int(rate * seconds)
    tag = f"{variant}-{time.time_ns()}"
    headers = {**system.headers(), "Content-Type": "application/json"}
    failures = 0
    sdk = openai.AsyncOpenAI(
        base_url=f"{system.url}/v1", api_key=system.keys["paid"], max_retries=0, timeout=30
    )
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=30),
    )

    async def post(path: str, body: dict[str, Any]) -> int:
        nonlocal failures
        async with session.post(f"{system.url}{path}", data=orjson.dumps(body)) as r:
            raw = await r.read()
            if r.status != 200:
                failures += 1
            return len(raw)

    async def call(i: int) -> int:
        nonlocal failures
        text = f"{tag} input {i}"
        if variant == "infer":
            return await post("/v1/infer", {"model": "sim", "input": text})
        if variant == "embeddings_raw":
            body = {"model": "sim", "input": text, "encoding_format": "base64"}
            return await post("/v1/embeddings", body)
        try:
            if variant == "sdk_base64":  # the SDK asks for base64 and decodes it itself
                r = await sdk.embeddings.with_raw_response.create(model="sim", input=text)
            else:
                r = await sdk.embeddings.with_raw_response.create(
                    model="sim", input=text, encoding_format="float"
                )
            emb = r.parse()
            if len(emb.data[0].embedding) != dim:
                failures += 1
            return len(r.content)
        except openai.APIError:
            failures += 1
            return 0

    try:
        await call(-1)  # warm the connection pool and the route
        failures = 0
        lat, sizes, wall, cpu = await measured(system, rate, count, call)
    finally:
        await session.close()
        await sdk.close()
    return run_row(variant, rate, count - failures, lat, sizes, wall, cpu, "item")


def run_row(
    variant: str,
    rate: float,
    ok: int,
    lat: list[float],
    sizes: list[int],
    wall: float,
    cpu: tuple[float, float],
    per: str,
) -> dict[str, Any]:
    """One open-loop run's row: ``cpu`` is (API CPU s, elapsed s) over it; its CPU is
    per answered ``per`` (item or request)."""
    return {
        "variant": variant,
        "offered_rps": rate,
        "requests": len(lat),
        "ok": ok,
        "wall_s": round(wall, 1),
        f"api_cpu_ms_per_{per}": round(cpu[0] * 1000 / max(1, ok), 3),
        "api_cpu_share": round(cpu[0] / cpu[1], 3),
        "p50_ms": pct(lat, 50),
        "p95_ms": pct(lat, 95),
        "p99_ms": pct(lat, 99),
        "answer_bytes": round(statistics.mean(sizes)) if sizes else 0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rate", type=float, default=100.0, help="requests/s, every variant")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--dim", type=int, default=384, help="sim's vector length")
    ap.add_argument("--rounds", type=int, default=2, help="variants run in turn, this often")
    ap.add_argument(
        "--variants", default="infer,sdk_base64,sdk_float,embeddings_raw", help="comma-separated"
    )
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    env = {
        "GRISTMILL_SIM_VECTOR_DIM": str(args.dim),
        "GRISTMILL_SIM_BATCH_MS": "10",
    }
    runs: list[dict[str, Any]] = []
    with ExitStack() as stack:
        system = sim_system(stack, "gm-compat-", extra_env=env)
        for _ in range(args.rounds):
            for v in args.variants.split(","):
                r = asyncio.run(run_variant(system, v, args.rate, args.seconds, args.dim))
                print(json.dumps(r))
                runs.append(r)
    by: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["variant"], []).append(r)
    summary = {
        v: {
            "api_cpu_ms_per_item": round(
                statistics.median(x["api_cpu_ms_per_item"] for x in rs), 3
            ),
            "p95_ms": round(statistics.median(x["p95_ms"] for x in rs), 1),
            "answer_bytes": rs[0]["answer_bytes"],
        }
        for v, rs in by.items()
    }
    base = summary.get("infer", {}).get("api_cpu_ms_per_item")
    if base:
        for s in summary.values():
            s["vs_infer"] = round(s["api_cpu_ms_per_item"] / base, 3)
    report = {
        "rate": args.rate,
        "seconds": args.seconds,
        "dim": args.dim,
        "runs": runs,
        "summary": summary,
    }
    write_report(args.out, "compat", report)
    return 0


def write_report(out: Path, name: str, report: dict[str, Any]) -> Path:
    """``report`` to ``out/<name>-<time>.json``; its summary and path printed."""
    path = out / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(json.dumps(report["summary"], indent=2))
    print(f"report: {path}")
    return path


if __name__ == "__main__":
    raise SystemExit(main())
