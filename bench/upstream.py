"""A small single-item model service: the kind of existing HTTP endpoint Gristmill fronts
with its HTTP backend (workers/models/http_backend.py, docs/models.md).

    python -m bench.upstream --port 9100 [--delay-ms 5]

``POST /predict {"text": "..."}`` answers ``{"result": {"label": ..., "length": ...}}``,
one input per call, derived from the text (``upstream_output``) so a test can check
every answer. Tests and benchmarks steer it while it runs:

    POST /control {"delay_ms": 200}                  slow
    POST /control {"fail_rate": 1.0, "status": 503}  failing (0..1 of calls)
    POST /control {"delay_ms": 0, "fail_rate": 0}    healthy again
    GET  /stats  -> calls, failures, calls in flight now and at most

and restart it (kill the process, start it again on the same port) to see it go away
and come back.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gristmill.devservices import free_port
from gristmill.devservices.stack import REPO


def upstream_output(text: str) -> dict[str, Any]:
    """What the service answers for ``text``: Gristmill's response path takes ``result``."""
    return {"label": hashlib.sha256(text.encode()).hexdigest()[:12], "length": len(text)}


class State:
    def __init__(self, delay_ms: float = 0.0):
        self.delay_ms = delay_ms
        self.fail_rate = 0.0
        self.status = 503
        self.calls = 0
        self.failures = 0
        self.inflight = 0
        self.inflight_max = 0


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def make_app(delay_ms: float = 0.0, seed: int | None = None) -> Starlette:
    state = State(delay_ms)
    rng = random.Random(seed)

    async def predict(request: Request) -> Response:
        state.calls += 1
        state.inflight += 1
        state.inflight_max = max(state.inflight_max, state.inflight)
        try:
            try:
                body = orjson.loads(await request.body())
                text = body["text"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                return _json({"error": 'expected {"text": string}'}, 400)
            if not isinstance(text, str):
                return _json({"error": "text must be a string"}, 400)
            if state.delay_ms:
                await asyncio.sleep(state.delay_ms / 1000)
            if state.fail_rate and rng.random() < state.fail_rate:
                state.failures += 1
                return _json({"error": "unavailable"}, state.status)
            return _json({"result": upstream_output(text)})
        finally:
            state.inflight -= 1

    async def control(request: Request) -> Response:
        body = orjson.loads(await request.body())
        state.delay_ms = float(body.get("delay_ms", state.delay_ms))
        state.fail_rate = float(body.get("fail_rate", state.fail_rate))
        state.status = int(body.get("status", state.status))
        return _json({"delay_ms": state.delay_ms, "fail_rate": state.fail_rate})

    async def stats(_: Request) -> Response:
        return _json(
            {
                "calls": state.calls,
                "failures": state.failures,
                "inflight": state.inflight,
                "inflight_max": state.inflight_max,
            }
        )

    async def health(_: Request) -> Response:
        return _json({"status": "ok"})

    return Starlette(
        routes=[
            Route("/predict", predict, methods=["POST"]),
            Route("/control", control, methods=["POST"]),
            Route("/stats", stats),
            Route("/health", health),
        ]
    )


class UpstreamProcess:
    """This service in a child process on a free port, started, steered, killed and
    started again on the same port by a test or a benchmark."""

    def __init__(self, log: Path, delay_ms: float):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.delay_ms = delay_ms
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.upstream",
                "--port",
                str(self.port),
                "--delay-ms",
                str(self.delay_ms),
            ],
            cwd=REPO,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("the upstream did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def control(self, **kw: Any) -> None:
        assert httpx.post(f"{self.url}/control", json=kw, timeout=5).status_code == 200

    def stats(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/stats", timeout=5).json())


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="bench.upstream")
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    args = parser.parse_args()
    uvicorn.run(
        make_app(args.delay_ms),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
