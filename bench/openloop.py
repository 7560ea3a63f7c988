"""An open-loop load generator: requests start on schedule whether or not earlier
ones finished, so overload shows up as latency, not as a politely slower client.

Latency is measured from each request's *intended* send time (no coordinated
omission). Used by ``bench.loadtest`` and the benchmark suite.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson


@dataclass
class Sample:
    intended: float  # seconds since start
    latency_ms: float
    status: int
    body: dict[str, Any] | None


@dataclass
class RunResult:
    rate: float
    duration_s: float
    samples: list[Sample] = field(default_factory=list)

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.status == 200]

    def statuses(self) -> dict[int, int]:
        return dict(Counter(s.status for s in self.samples))

    def percentile(self, q: float, only_ok: bool = True) -> float:
        xs = sorted(s.latency_ms for s in (self.ok if only_ok else self.samples))
        if not xs:
            return float("nan")
        k = min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))
        return xs[k]

    def achieved_rps(self) -> float:
        return len(self.ok) / self.duration_s if self.duration_s else 0.0

    def summary(self) -> dict[str, Any]:
        sizes = [s.body["batch_size"] for s in self.ok if s.body and s.body.get("batch_size")]
        return {
            "offered_rps": self.rate,
            "requests": len(self.samples),
            "achieved_rps": round(self.achieved_rps(), 1),
            "p50_ms": round(self.percentile(50), 1),
            "p95_ms": round(self.percentile(95), 1),
            "p99_ms": round(self.percentile(99), 1),
            "max_ms": round(self.percentile(100), 1),
            "statuses": self.statuses(),
            "mean_batch_size": round(sum(sizes) / len(sizes), 1) if sizes else None,
        }


async def run_open_loop(
    *,
    url: str,
    headers: dict[str, str],
    rate: float,
    count: int,
    make_body: Callable[[int], dict[str, Any]],
    timeout_s: float = 30.0,
    on_done: Callable[[Sample], None] | None = None,
) -> RunResult:
    # aiohttp, not httpx: at these rates the client's own CPU cost decides whether we
    # measure the server or the load generator (httpx saturated a core at ~60 req/s here).
    result = RunResult(rate=rate, duration_s=count / rate)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    hdrs = {**headers, "Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=hdrs) as client:
        start = time.perf_counter()

        async def one(i: int) -> None:
            intended = i / rate
            delay = start + intended - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                async with client.post(url, data=orjson.dumps(make_body(i))) as r:
                    status = r.status
                    raw = await r.read()
                body = orjson.loads(raw) if status == 200 else None
            except (aiohttp.ClientError, TimeoutError):
                status, body = 0, None
            latency = (time.perf_counter() - start - intended) * 1000
            s = Sample(intended, latency, status, body)
            result.samples.append(s)
            if on_done:
                on_done(s)

        await asyncio.gather(*(one(i) for i in range(count)))
        result.duration_s = max(result.duration_s, time.perf_counter() - start)
    return result
