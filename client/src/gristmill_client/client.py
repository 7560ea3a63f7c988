"""Python client for Gristmill: sync ``Client`` and ``AsyncClient``.

    from gristmill_client import Client
    gm = Client("http://127.0.0.1:8000", "gm_...")
    gm.infer("sim", "hello")["output"]
    job = gm.submit_job("sim", [{"input": "a"}, {"input": "b"}])
    gm.wait(job["job_id"])
    for item in gm.iter_results(job["job_id"]): ...

Both retry 429 and 503 answers, honouring Retry-After, with jittered exponential
backoff otherwise. Uploads of files are retried too: every job submission
carries an Idempotency-Key, so a retried upload can never create a second job.
``Client.from_env()`` reads GRISTMILL_URL and GRISTMILL_API_KEY, falling back to
the ``.gristmill/dev.env`` that ``make dev`` writes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Generic, Self, TypeVar

import httpx

RETRY_STATUSES = (429, 503)
FINISHED = ("completed", "failed", "cancelled", "expired")
_CHUNK = 1 << 20


class GristmillHTTPError(Exception):
    def __init__(self, response: httpx.Response):
        try:
            err = response.json().get("error", {})
        except ValueError:
            err = {"message": response.text[:500]}
        super().__init__(f"HTTP {response.status_code}: {err.get('message')}")
        self.status = response.status_code
        self.code = err.get("code")
        self.field = err.get("field")
        self.response = response


def retry_delay_s(response: httpx.Response | None, attempt: int) -> float:
    """Retry-After when the server gives one, else full-jitter exponential backoff."""
    if response is not None:
        ra = response.headers.get("Retry-After")
        if ra and ra.isdigit():
            return float(ra)
    return random.uniform(0, min(10.0, 0.25 * 2**attempt))


def _backoff(response: httpx.Response | None, attempt: int, max_retries: int) -> float | None:
    """Seconds to wait before retrying this outcome (no response: a transport error), or
    None when it is final. One policy for both clients."""
    if attempt >= max_retries:
        return None
    if response is None or response.status_code in RETRY_STATUSES:
        return retry_delay_s(response, attempt)
    return None


def _settle(
    outcome: httpx.Response | httpx.TransportError, attempt: int, max_retries: int
) -> httpx.Response | float:
    """The checked response when this outcome is final (its error raised), else the
    seconds to wait before the next attempt. The retry loop of both clients."""
    response = outcome if isinstance(outcome, httpx.Response) else None
    delay = _backoff(response, attempt, max_retries)
    if delay is not None:
        return delay
    if isinstance(outcome, httpx.TransportError):
        raise outcome
    return _checked(outcome)


def _dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON (the standard library: the client depends on httpx alone)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _checked(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 400:
        raise GristmillHTTPError(response)
    return response


def _settings_from_env() -> tuple[str, str]:
    env = dict(os.environ)
    dev = Path(".gristmill/dev.env")
    if dev.exists():
        for line in dev.read_text().splitlines():
            k, _, v = line.partition("=")
            env.setdefault(k, v)
    url, key = env.get("GRISTMILL_URL"), env.get("GRISTMILL_API_KEY")
    if not url or not key:
        raise RuntimeError("set GRISTMILL_URL and GRISTMILL_API_KEY (or run `make dev`)")
    return url, key


def _jsonl_chunks(items: Iterable[dict[str, Any] | str]) -> Iterator[bytes]:
    """Items as JSONL bytes, a megabyte at a time; plain strings become {"input": s}."""
    buf: list[bytes] = []
    size = 0
    for item in items:
        line = _dumps({"input": item} if isinstance(item, str) else item) + b"\n"
        buf.append(line)
        size += len(line)
        if size >= _CHUNK:
            yield b"".join(buf)
            buf, size = [], 0
    if buf:
        yield b"".join(buf)


def _file_chunks(path: Path, on_bytes: Callable[[int], None] | None) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            if on_bytes:
                on_bytes(len(chunk))
            yield chunk


def _job_query(
    model: str,
    params: dict[str, Any] | None,
    completion_window_s: int | None,
    webhook_url: str | None,
    base_job_id: str | None = None,
) -> dict[str, str]:
    q = {"model": model}
    if base_job_id:  # an incremental job: unchanged items reuse this job's results
        q["base_job_id"] = base_job_id
    if params:
        q["params"] = _dumps(params).decode()
    if completion_window_s:
        q["completion_window_s"] = str(completion_window_s)
    if webhook_url:
        q["webhook_url"] = webhook_url
    return q


def _infer_request(
    model: str,
    input: Any,
    params: dict[str, Any] | None,
    timeout_ms: int | None,
    idempotency_key: str | None,
) -> tuple[bytes, dict[str, str]]:
    payload: dict[str, Any] = {"model": model, "input": input}
    if params:
        payload["params"] = params
    if timeout_ms:
        payload["timeout_ms"] = timeout_ms
    return _dumps(payload), _headers(idempotency_key, "application/json")


def _waited_out(job: dict[str, Any], job_id: str, deadline: float | None) -> bool:
    """Whether ``wait`` is over: the job finished (True), or ``deadline`` (monotonic)
    passed first (TimeoutError). The poll loop of both clients."""
    if job["status"] in FINISHED and job["finished_at"]:
        return True
    if deadline is not None and time.monotonic() > deadline:
        raise TimeoutError(f"job {job_id} is still {job['status']}")
    return False


def _headers(idempotency_key: str | None, content_type: str) -> dict[str, str]:
    # Always send a key, so a retried request is never computed twice (nor a job made twice).
    return {"Idempotency-Key": idempotency_key or str(uuid.uuid4()), "Content-Type": content_type}


_Http = TypeVar("_Http", httpx.Client, httpx.AsyncClient)


class _Base(Generic[_Http]):
    """What the sync and async clients share: settings, and the httpx client they hold."""

    _http_class: type[_Http]
    _http: _Http

    def __init__(self, url: str, api_key: str, *, timeout_s: float = 60.0, max_retries: int = 6):
        self.max_retries = max_retries
        self._http = self._http_class(
            base_url=url, timeout=timeout_s, headers={"Authorization": f"Bearer {api_key}"}
        )

    @classmethod
    def from_env(cls, **kwargs: Any) -> Self:
        return cls(*_settings_from_env(), **kwargs)


class Client(_Base[httpx.Client]):
    _http_class = httpx.Client

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(
        self, method: str, path: str, *, body: Callable[[], Any] | None = None, **kwargs: Any
    ) -> httpx.Response:
        """``body`` builds fresh content for each attempt (a stream can be read once)."""
        for attempt in itertools.count():
            outcome: httpx.Response | httpx.TransportError
            try:
                outcome = self._http.request(
                    method, path, content=body() if body else None, **kwargs
                )
            except httpx.TransportError as exc:
                outcome = exc
            settled = _settle(outcome, attempt, self.max_retries)
            if isinstance(settled, httpx.Response):
                return settled
            time.sleep(settled)
        raise AssertionError("unreachable")

    def infer(
        self,
        model: str,
        input: Any,
        *,
        params: dict[str, Any] | None = None,
        timeout_ms: int | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        data, headers = _infer_request(model, input, params, timeout_ms, idempotency_key)
        return dict(self._request("POST", "/v1/infer", body=lambda: data, headers=headers).json())

    def submit_job(
        self,
        model: str,
        items: Iterable[dict[str, Any] | str] | Path,
        *,
        params: dict[str, Any] | None = None,
        completion_window_s: int | None = None,
        webhook_url: str | None = None,
        idempotency_key: str | None = None,
        on_bytes: Callable[[int], None] | None = None,
        base_job_id: str | None = None,
    ) -> dict[str, Any]:
        """Submit a job from a JSONL file (streamed, retried) or an iterable of items;
        with ``base_job_id`` (a finished job of the same model version) items whose
        input and params are unchanged reuse its results instead of being computed."""
        headers = _headers(idempotency_key, "application/x-ndjson")
        query = _job_query(model, params, completion_window_s, webhook_url, base_job_id)
        if isinstance(items, Path):
            path = items
            return dict(
                self._request(
                    "POST",
                    "/v1/jobs",
                    params=query,
                    headers=headers,
                    body=lambda: _file_chunks(path, on_bytes),
                ).json()
            )
        data = b"".join(_jsonl_chunks(items))  # an iterable is read once: keep it to retry
        return dict(
            self._request(
                "POST", "/v1/jobs", params=query, headers=headers, body=lambda: data
            ).json()
        )

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self._request("GET", f"/v1/jobs/{job_id}").json())

    def cancel(self, job_id: str) -> dict[str, Any]:
        return dict(self._request("POST", f"/v1/jobs/{job_id}/cancel").json())

    def retry(self, job_id: str) -> dict[str, Any]:
        return dict(self._request("POST", f"/v1/jobs/{job_id}/retry").json())

    def jobs(self, limit: int = 20) -> list[dict[str, Any]]:
        return list(self._request("GET", "/v1/jobs", params={"limit": limit}).json()["jobs"])

    def wait(
        self,
        job_id: str,
        *,
        poll_s: float = 1.0,
        timeout_s: float | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            j = self.job(job_id)
            if on_progress:
                on_progress(j)
            if _waited_out(j, job_id, deadline):
                return j
            time.sleep(poll_s)

    def iter_results(self, job_id: str, *, follow: bool = False) -> Iterator[dict[str, Any]]:
        """Per-item results in input order (streamed NDJSON)."""
        with self._http.stream(
            "GET",
            f"/v1/jobs/{job_id}/results",
            params={"follow": str(follow).lower()},
            timeout=None,
        ) as r:
            if r.status_code >= 400:
                r.read()
                raise GristmillHTTPError(r)
            for line in r.iter_lines():
                if line:
                    yield json.loads(line)


class AsyncClient(_Base[httpx.AsyncClient]):
    """The same API for asyncio code."""

    _http_class = httpx.AsyncClient

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _request(
        self, method: str, path: str, *, content: bytes | None = None, **kwargs: Any
    ) -> httpx.Response:
        for attempt in itertools.count():
            outcome: httpx.Response | httpx.TransportError
            try:
                outcome = await self._http.request(method, path, content=content, **kwargs)
            except httpx.TransportError as exc:
                outcome = exc
            settled = _settle(outcome, attempt, self.max_retries)
            if isinstance(settled, httpx.Response):
                return settled
            await asyncio.sleep(settled)
        raise AssertionError("unreachable")

    async def infer(
        self,
        model: str,
        input: Any,
        *,
        params: dict[str, Any] | None = None,
        timeout_ms: int | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        data, headers = _infer_request(model, input, params, timeout_ms, idempotency_key)
        r = await self._request("POST", "/v1/infer", content=data, headers=headers)
        return dict(r.json())

    async def submit_job(
        self,
        model: str,
        items: Iterable[dict[str, Any] | str],
        *,
        params: dict[str, Any] | None = None,
        completion_window_s: int | None = None,
        webhook_url: str | None = None,
        idempotency_key: str | None = None,
        base_job_id: str | None = None,
    ) -> dict[str, Any]:
        headers = _headers(idempotency_key, "application/x-ndjson")
        r = await self._request(
            "POST",
            "/v1/jobs",
            content=b"".join(_jsonl_chunks(items)),
            params=_job_query(model, params, completion_window_s, webhook_url, base_job_id),
            headers=headers,
        )
        return dict(r.json())

    async def job(self, job_id: str) -> dict[str, Any]:
        return dict((await self._request("GET", f"/v1/jobs/{job_id}")).json())

    async def cancel(self, job_id: str) -> dict[str, Any]:
        return dict((await self._request("POST", f"/v1/jobs/{job_id}/cancel")).json())

    async def wait(
        self, job_id: str, *, poll_s: float = 1.0, timeout_s: float | None = None
    ) -> dict[str, Any]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            j = await self.job(job_id)
            if _waited_out(j, job_id, deadline):
                return j
            await asyncio.sleep(poll_s)

    async def iter_results(
        self, job_id: str, *, follow: bool = False
    ) -> AsyncIterator[dict[str, Any]]:
        async with self._http.stream(
            "GET",
            f"/v1/jobs/{job_id}/results",
            params={"follow": str(follow).lower()},
            timeout=None,
        ) as r:
            if r.status_code >= 400:
                await r.aread()
                raise GristmillHTTPError(r)
            async for line in r.aiter_lines():
                if line:
                    yield json.loads(line)
