"""A steady open-loop load: requests start on schedule whatever happened to earlier
ones, so an outage shows up as errors and latency instead of a politely slower
client. Runs its own asyncio loop in a background thread; every answer goes to
the ledger.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from typing import Any

import orjson

from core.vocab import TIERS
from gristmill.chaos.ledger import CONN_ERROR, JobOutcome, Ledger, Outcome

SALTS = ("", "s1", "s2")  # different batch keys, so batches never mix salts


class LoadGenerator:
    def __init__(
        self,
        *,
        urls: list[str],
        keys: dict[str, str],
        ledger: Ledger,
        rate: float,
        timeout_ms: int = 10_000,
        job_every_s: float | None = None,
        job_items: int = 20,
        seed: int = 0,
    ):
        self.urls = urls
        self.keys = keys
        self.ledger = ledger
        self.rate = rate
        self.timeout_ms = timeout_ms
        self.job_every_s = job_every_s
        self.job_items = job_items
        self.rng = random.Random(seed)
        self.run = uuid.uuid4().hex[:8]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.in_flight = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="chaos-load", daemon=True)
        self._thread.start()

    def stop(self, drain_timeout_s: float = 30.0) -> None:
        """Stop sending; wait for the answers still outstanding."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(drain_timeout_s + 5)

    def _main(self) -> None:
        asyncio.run(self._drive())

    async def _drive(self) -> None:
        import aiohttp  # a dev dependency; imported only when a run starts

        timeout = aiohttp.ClientTimeout(total=self.timeout_ms / 1000 + 5)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            tasks: set[asyncio.Task[None]] = set()
            start = time.perf_counter()
            next_job = start + (self.job_every_s or 0)
            i = 0
            while not self._stop.is_set():
                delay = start + i / self.rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(self._one(session, i))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                if self.job_every_s and time.perf_counter() >= next_job:
                    next_job += self.job_every_s
                    job = asyncio.create_task(self._job(session, i))
                    tasks.add(job)
                    job.add_done_callback(tasks.discard)
                i += 1
            if tasks:
                await asyncio.wait(tasks, timeout=self.timeout_ms / 1000 + 10)

    def _pick(self, i: int) -> tuple[int, str, str]:
        return i % len(self.urls), self.rng.choice(TIERS), self.rng.choice(SALTS)

    def _post(
        self, session: Any, api: int, tier: str, path: str, body: dict[str, Any], salt: str
    ) -> Any:
        """POST ``body`` (with the salt's params, if any) to one API instance as the tier's
        tenant: an aiohttp response context."""
        if salt:
            body = {**body, "params": {"salt": salt}}
        return session.post(
            f"{self.urls[api]}{path}",
            data=orjson.dumps(body),
            headers={
                "Authorization": f"Bearer {self.keys[tier]}",
                "Content-Type": "application/json",
            },
        )

    async def _one(self, session: Any, i: int) -> None:
        import aiohttp

        api, tier, salt = self._pick(i)
        o = Outcome(
            seq=i,
            api=api,
            tier=tier,
            input=f"chaos {self.run} {i} {uuid.uuid4().hex[:12]}",
            salt=salt,
            sent_at=time.time(),
        )
        self.ledger.add(o)
        body = {"model": "sim", "input": o.input, "timeout_ms": self.timeout_ms}
        self.in_flight += 1
        try:
            async with self._post(session, api, tier, "/v1/infer", body, salt) as r:
                raw = await r.read()
                parsed = _json(raw)
                o.read_answer(r.status, parsed, r.headers.get("Retry-After"))
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            o.status, o.error = CONN_ERROR, type(exc).__name__
        finally:
            o.done_at = time.time()
            self.in_flight -= 1

    async def _job(self, session: Any, i: int) -> None:
        import aiohttp

        api, tier, salt = self._pick(i)
        inputs = [
            f"chaos-job {self.run} {i} {k} {uuid.uuid4().hex[:8]}" for k in range(self.job_items)
        ]
        j = JobOutcome(seq=i, api=api, tier=tier, salt=salt, inputs=inputs, sent_at=time.time())
        self.ledger.add_job(j)
        body = {"model": "sim", "items": [{"input": x} for x in inputs]}
        try:
            async with self._post(session, api, tier, "/v1/jobs", body, salt) as r:
                parsed = _json(await r.read())
                j.status = r.status
                if parsed is not None:
                    j.job_id = parsed.get("job_id")
                    if r.status != 202:
                        j.error = str(parsed.get("error"))[:300]
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            j.status, j.error = CONN_ERROR, type(exc).__name__
        finally:
            j.done_at = time.time()


def _json(raw: bytes) -> dict[str, Any] | None:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
