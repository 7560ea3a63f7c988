"""What KServe's infer costs the API over gRPC, against the same over HTTP.

One system (its own Kafka and PostgreSQL, one API process serving both protocols, one
scheduler with ``sim`` workers in vector mode: each answer a float32 vector of
``--dim`` values, the embedding model's shape, at no compute cost), driven open-loop at
the same rate, in turn, by:

* ``http``: ``POST /v2/models/sim/infer`` through aiohttp, the body as
  ``tritonclient.http`` sends it by default (a JSON header, the texts and the answer in
  the binary tensor extension);
* ``grpc``: ``ModelInfer`` through a grpc.aio stub over one channel, the message as
  ``tritonclient.grpc`` builds it (the texts in ``raw_input_contents``).

Raw clients on both sides: the machine is shared, so the client's own cost is kept
small and alike. For each: the API process's CPU ms per answered request (user +
system, from /proc, over the run), latency percentiles; medians over ``--rounds``.

    flock /tmp/gristmill-heavy.lock .venv/bin/python -m bench.kserve_grpc --rate 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import struct
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import orjson
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from bench.compat import measured, run_row, write_report
from bench.system import sim_system
from gristmill.devservices import free_port
from gristmill.devservices.stack import System


def _bytes_tensor(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<I", len(raw)) + raw


async def run_variant(
    system: System, grpc_url: str, variant: str, rate: float, seconds: float
) -> dict[str, Any]:
    count = int(rate * seconds)
    tag = f"{variant}-{time.time_ns()}"
    failures = 0
    key = system.keys["paid"]
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        headers={"Authorization": f"Bearer {key}"},
        timeout=aiohttp.ClientTimeout(total=30),
    )
    channel = grpc.aio.insecure_channel(grpc_url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    meta = (("authorization", f"Bearer {key}"),)

    async def http(text: str) -> int:
        nonlocal failures
        blob = _bytes_tensor(text)
        head = orjson.dumps(
            {
                "inputs": [
                    {
                        "name": "text",
                        "datatype": "BYTES",
                        "shape": [1],
                        "parameters": {"binary_data_size": len(blob)},
                    }
                ],
                "outputs": [{"name": "embedding", "parameters": {"binary_data": True}}],
            }
        )
        async with session.post(
            f"{system.url}/v2/models/sim/infer",
            data=head + blob,
            headers={
                "Content-Type": "application/octet-stream",
                "Inference-Header-Content-Length": str(len(head)),
            },
        ) as r:
            raw = await r.read()
            if r.status != 200:
                failures += 1
            return len(raw)

    async def rpc(text: str) -> int:
        nonlocal failures
        m = pb.ModelInferRequest(model_name="sim", raw_input_contents=[_bytes_tensor(text)])
        m.inputs.add(name="text", datatype="BYTES", shape=[1])
        m.outputs.add(name="embedding")
        try:
            answer = await stub.ModelInfer(m, metadata=meta, timeout=30)
        except grpc.RpcError:
            failures += 1
            return 0
        return answer.ByteSize()

    send = http if variant == "http" else rpc

    async def call(i: int) -> int:
        return await send(f"{tag} input {i}")

    try:
        await call(-1)  # warm the connection and the route
        failures = 0
        lat, sizes, wall, cpu = await measured(system, rate, count, call)
    finally:
        await session.close()
        await channel.close()
    return run_row(variant, rate, count - failures, lat, sizes, wall, cpu, "request")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rate", type=float, default=200.0, help="requests/s, both protocols")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--dim", type=int, default=384, help="sim's vector length")
    ap.add_argument("--rounds", type=int, default=3, help="protocols run in turn, this often")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {
        "GRISTMILL_SIM_VECTOR_DIM": str(args.dim),
        "GRISTMILL_SIM_BATCH_MS": "10",
        "GRISTMILL_GRPC_PORT": str(port),
    }
    runs: list[dict[str, Any]] = []
    with ExitStack() as stack:
        system = sim_system(stack, "gm-grpc-", extra_env=env)
        for _ in range(args.rounds):
            for v in ("http", "grpc"):
                r = asyncio.run(
                    run_variant(system, f"127.0.0.1:{port}", v, args.rate, args.seconds)
                )
                print(json.dumps(r), flush=True)
                runs.append(r)
    summary: dict[str, dict[str, Any]] = {}
    for v in ("http", "grpc"):
        rs = [r for r in runs if r["variant"] == v]
        summary[v] = {
            "api_cpu_ms_per_request": round(
                statistics.median(x["api_cpu_ms_per_request"] for x in rs), 3
            ),
            "p50_ms": round(statistics.median(x["p50_ms"] for x in rs), 1),
            "p95_ms": round(statistics.median(x["p95_ms"] for x in rs), 1),
            "p99_ms": round(statistics.median(x["p99_ms"] for x in rs), 1),
            "answer_bytes": rs[0]["answer_bytes"],
        }
    summary["grpc"]["vs_http"] = round(
        summary["grpc"]["api_cpu_ms_per_request"] / summary["http"]["api_cpu_ms_per_request"], 3
    )
    report = {"rate": args.rate, "seconds": args.seconds, "dim": args.dim, "runs": runs}
    write_report(args.out, "kserve-grpc", {**report, "summary": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
