"""A model that lives behind HTTP (core/models/http.py), as a worker runs it.

Gristmill batches and queues in front of an existing single-item service: a batch of n
inputs becomes n calls, at most ``concurrency`` in flight (a thread pool over one
connection pool), outputs in input order.

* A transient failure (connection refused or reset, timeout, 429, 502, 503, 504) is
  retried with tenacity: full-jitter exponential backoff, ``http_attempts`` tries.
* A call that still fails counts against the circuit (workers/models/breaker.py):
  ``http_breaker_failures`` in a row open it. An open circuit stops every call of the
  batch and hands the batch back unrun (``ModelUnavailable``), so the scheduler keeps
  the model's queue waiting (job items wait; sync requests run out their deadline) and
  the API answers new requests 503 with the time left as Retry-After. After
  ``http_breaker_open_s`` the worker sends one probe of its own (``probe_input``);
  success closes the circuit and the model reports ready again.
* Any other answer (a 4xx, a 500, an answer without the response path) is this input's
  failure: the batch fails naming it, and the scheduler's split isolates the input.

A batch handed back may be sent again in full: calls that had succeeded are made again
(the upstream must tolerate a repeated call, as any at-least-once consumer must).
Warm-up measures the latency curve at a few batch sizes with the probe input, like any
worker; the scheduler refines it from every batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import orjson
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from core.models.http import HttpSpec, TemplateError, extract, parse_path, render
from core.protocol import ModelState
from workers.models.base import Model, ModelUnavailable
from workers.models.breaker import Breaker, Circuit

log = logging.getLogger(__name__)

TRANSIENT_STATUS = frozenset({429, 502, 503, 504})
# Backoff between tries of one call (s): full jitter, exponential from 50 ms, capped at
# 1 s so three tries stay well inside a sync request's deadline.
BACKOFF_START_S = 0.05
BACKOFF_MAX_S = 1.0
# Warm-up batch sizes, in multiples of the concurrency: one call, one full wave, a few.
WARMUP_WAVES = (0, 1, 2, 4)


class Transient(Exception):
    """A failure worth retrying: the service may answer the same call next time."""


class ItemFailed(Exception):
    """The service refused this input, or answered without the output."""


class HttpModel(Model):
    def __init__(
        self,
        spec: HttpSpec,
        *,
        attempts: int = 3,
        breaker: Breaker | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.spec: HttpSpec = spec
        self.attempts = attempts
        self.breaker = breaker or Breaker(failures=5, open_s=5.0)
        self.clock = clock
        self._path = parse_path(spec.response_path)
        self._lock = threading.Lock()  # the breaker's
        self._client = httpx.Client(
            timeout=spec.timeout_ms / 1000,
            limits=httpx.Limits(
                max_connections=spec.concurrency, max_keepalive_connections=spec.concurrency
            ),
        )
        self._pool = ThreadPoolExecutor(spec.concurrency, thread_name_prefix=f"http-{spec.name}")
        self._closed = threading.Event()
        self._wake = threading.Event()
        self._prober = threading.Thread(target=self._probe_loop, daemon=True, name="http-probe")
        self._prober.start()
        self.calls = 0  # calls sent, tries included (tests, benchmarks)

    # ---- one call ----------------------------------------------------------------------
    def _post(self, body: Any) -> Any:
        self.calls += 1
        try:
            r = self._client.post(
                self.spec.url,
                content=orjson.dumps(body),
                headers={"Content-Type": "application/json"},
            )
        except httpx.TransportError as exc:  # refused, reset, timed out
            raise Transient(f"{type(exc).__name__}: {exc}") from exc
        if r.status_code in TRANSIENT_STATUS:
            raise Transient(f"HTTP {r.status_code}")
        if r.status_code >= 400:
            raise ItemFailed(f"the service answered HTTP {r.status_code}: {r.text[:200]}")
        try:
            return extract(orjson.loads(r.content), self._path)
        except orjson.JSONDecodeError as exc:
            raise ItemFailed(f"the service's answer is not JSON: {r.text[:200]}") from exc
        except TemplateError as exc:
            raise ItemFailed(str(exc)) from exc

    def _gate(self) -> None:
        with self._lock:
            now = self.clock()
            if not self.breaker.allows_calls(now):
                raise ModelUnavailable(
                    f"{self.spec.url} is down (circuit open)", self.breaker.retry_after(now)
                )

    def _call(self, input_: Any, params: dict[str, Any]) -> Any:
        try:
            body = render(self.spec.request_template, input_, params)
        except TemplateError as exc:
            raise ItemFailed(str(exc)) from exc
        try:
            for attempt in Retrying(
                stop=stop_after_attempt(self.attempts),
                wait=wait_random_exponential(multiplier=BACKOFF_START_S, max=BACKOFF_MAX_S),
                retry=retry_if_exception_type(Transient),
                reraise=True,
            ):
                with attempt:
                    self._gate()  # another call may have opened the circuit meanwhile
                    out = self._post(body)
        except Transient as exc:
            self._failed(str(exc))
            raise ModelUnavailable(
                f"{self.spec.url} failed {self.attempts} tries: {exc}",
                self.breaker.retry_after(self.clock()),
            ) from exc
        self._succeeded()
        return out

    def _failed(self, why: str) -> None:
        with self._lock:
            opened = self.breaker.failure(self.clock())
            wait = self.breaker.retry_after(self.clock())
        if opened:
            log.warning("circuit to %s opened: %s", self.spec.url, why)
            self._report(ModelState.UNAVAILABLE, f"{self.spec.url} is down: {why}", wait)
            self._wake.set()

    def _succeeded(self) -> None:
        with self._lock:
            closed = self.breaker.success(self.clock())
        if closed:
            log.warning("circuit to %s closed: the service answers again", self.spec.url)
            self._report(ModelState.READY, None, None)

    def _report(self, state: ModelState, error: str | None, retry_after_s: float | None) -> None:
        listener = self.status_listener
        if listener is not None:
            listener(state, error, retry_after_s)

    # ---- the batch API -------------------------------------------------------------------
    def predict(self, inputs: Sequence[Any], params: dict[str, Any]) -> list[Any]:
        if not 1 <= len(inputs) <= self.spec.max_batch_size:
            raise ValueError(f"batch of {len(inputs)}; at most {self.spec.max_batch_size}")
        self._gate()
        futures: list[Future[Any]] = [self._pool.submit(self._call, x, params) for x in inputs]
        outputs: list[Any] = []
        down: ModelUnavailable | None = None
        bad: tuple[int, ItemFailed] | None = None
        for i, f in enumerate(futures):
            try:
                outputs.append(f.result())
            except ModelUnavailable as exc:
                down = down or exc
            except ItemFailed as exc:
                bad = bad or (i, exc)
        if down is not None:
            raise down
        if bad is not None:
            raise ValueError(f"input {bad[0]} of the batch: {bad[1]}")
        return outputs

    def available(self) -> bool:
        with self._lock:
            return self.breaker.allows_calls(self.clock())

    def warmup(self) -> dict[int, float]:
        """Latency of a batch of probe inputs at a few sizes (ms); {} when the service
        does not answer (the circuit then says so, and the curve is learned online)."""
        sizes = sorted(
            {max(1, min(self.spec.max_batch_size, w * self.spec.concurrency)) for w in WARMUP_WAVES}
        )
        profile: dict[int, float] = {}
        for n in sizes:
            t0 = time.perf_counter()
            try:
                self.predict([self.spec.probe_input] * n, self._probe_params())
            except (ModelUnavailable, ValueError) as exc:
                log.warning("warm-up of %s stopped: %s", self.spec.ref, exc)
                break
            profile[n] = (time.perf_counter() - t0) * 1000
        return profile

    def _probe_params(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.spec.params}

    # ---- coming back -----------------------------------------------------------------
    def _probe_loop(self) -> None:
        """While the circuit is open: wait it out, send one probe, close or re-open."""
        while not self._closed.is_set():
            with self._lock:
                now = self.clock()
                state = self.breaker.state(now)
                wait = self.breaker.retry_after(now)
                probe = self.breaker.start_probe(now)
            if state is Circuit.CLOSED:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            if not probe:
                self._closed.wait(min(max(wait, 0.05), 1.0))
                continue
            try:
                body = render(
                    self.spec.request_template, self.spec.probe_input, self._probe_params()
                )
                self._post(body)
            except (Transient, ItemFailed) as exc:
                # An answer that is not transient (a 4xx for the probe input) still
                # proves the service is up.
                if isinstance(exc, ItemFailed):
                    self._succeeded()
                else:
                    with self._lock:
                        self.breaker.failure(self.clock())
                        wait = self.breaker.retry_after(self.clock())
                    self._report(ModelState.UNAVAILABLE, f"{self.spec.url} is down: {exc}", wait)
                continue
            self._succeeded()

    def close(self) -> None:
        self._closed.set()
        self._wake.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()
