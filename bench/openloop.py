"""An open-loop load generator: requests start on schedule whether or not earlier
ones finished, so overload shows up as latency, not as a politely slower client.

Latency is measured from each request's *intended* send time (no coordinated
omission). Used by ``bench.loadtest`` and the benchmark suite.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from bench.rawhttp import HttpError, RawPool


def percentile(xs: Iterable[float], q: float) -> float:
    """The nearest-rank ``q`` percentile (0-100) of ``xs``, nan for none: the one
    definition every benchmark table here uses."""
    s = sorted(xs)
    if not s:
        return float("nan")
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


@dataclass
class Sample:
    intended: float  # seconds since start
    latency_ms: float
    status: int
    body: dict[str, Any] | None
    retry_after: str | None = None  # the Retry-After header of a 429/503
    error: str | None = None  # the error message of a non-200 answer


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
        return percentile((s.latency_ms for s in (self.ok if only_ok else self.samples)), q)

    def outcomes(self) -> dict[str, Any]:
        """Answers by kind and latency percentiles of the served ones (one table row)."""
        st = self.statuses()
        return {
            "offered": len(self.samples),
            "served_200": st.get(200, 0),
            "shed_429": st.get(429, 0),
            "shed_503": st.get(503, 0),
            "late_504": st.get(504, 0),
            "other": sum(v for k, v in st.items() if k not in (200, 429, 503, 504)),
            "p50_ms": round(self.percentile(50), 1),
            "p95_ms": round(self.percentile(95), 1),
            "p99_ms": round(self.percentile(99), 1),
            "retry_after_on_every_shed": all(
                s.retry_after for s in self.samples if s.status in (429, 503)
            ),
        }

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
            retry_after = None
            try:
                async with client.post(url, data=orjson.dumps(make_body(i))) as r:
                    status = r.status
                    raw = await r.read()
                    retry_after = r.headers.get("Retry-After")
                body = orjson.loads(raw) if status == 200 else None
                error = None if status == 200 else _error_message(raw)
            except (aiohttp.ClientError, TimeoutError) as exc:
                status, body, error = 0, None, type(exc).__name__
            latency = (time.perf_counter() - start - intended) * 1000
            s = Sample(intended, latency, status, body, retry_after, error)
            result.samples.append(s)
            if on_done:
                on_done(s)

        await asyncio.gather(*(one(i) for i in range(count)))
        result.duration_s = max(result.duration_s, time.perf_counter() - start)
    return result


def _error_message(raw: bytes) -> str:
    try:
        return str(orjson.loads(raw)["error"]["message"])[:200]
    except Exception:
        return raw[:200].decode(errors="replace")


# --------------------------------------------------------------------------------------------
# Multi-process open-loop load with HdrHistograms (the sweep's and the profiler's generator).
# One asyncio process tops out around 1-2k req/s here, so N processes each drive every N-th
# request of one shared schedule; each reports encoded histograms that the parent merges.

HDR_MAX_US = 300_000_000  # 5 minutes, in microseconds
STAGES = ("queue_ms", "batch_wait_ms", "compute_ms", "persist_ms")
DERIVED = ("respond_ms", "client_http_ms", "overhead_server_ms", "overhead_client_ms")


def new_hist() -> Any:
    from hdrh.histogram import HdrHistogram

    return HdrHistogram(1, HDR_MAX_US, 3)


@dataclass(frozen=True)
class LoadSpec:
    url: str  # the full infer URL
    headers: dict[str, str]
    rate: float  # offered requests per second, all processes together
    duration_s: float
    tag: str  # inputs are f"{tag}-{index}": unique, and each answer can be checked
    model: str = "sim"
    timeout_s: float = 15.0
    max_inflight: int = 6000  # per process; beyond it a request counts as client_overflow
    # A corpus (bench/corpus.py: texts and the model's own vectors for them): request j
    # sends text j mod n and its answer is checked against that text's vector. Empty:
    # sim inputs named by ``tag``, checked against sim's output.
    corpus: str = ""
    # "infer": the native route's body; "embeddings": OpenAI's, vectors in base64 as
    # the openai SDK asks for them.
    wire: str = "infer"
    # "aiohttp", or "raw" (bench/rawhttp.py: about a tenth of the client CPU a request,
    # for rates where the generator shares the measured host's cores).
    client: str = "aiohttp"


@dataclass
class LoadResult:
    spec: LoadSpec
    processes: int
    start_wall: float  # time.time() of the schedule's start
    window_s: float  # from schedule start to the last answer (at least duration_s)
    latency: Any  # HdrHistogram (µs) of 200 answers, from intended send time
    latency_all: Any  # every answer, errors included
    send_lag: Any  # actual send minus intended send (µs): the client's own lateness
    send_lag_by_s: list[float]  # the latest send of each second of the schedule (ms)
    # Each second of the schedule's requests (by when they were due): answered 200, and
    # not (refused, late, failed), so a run's bad minute shows when it began and ended.
    ok_by_s: list[int]
    failed_by_s: list[int]
    stages: dict[str, Any]  # stage -> HdrHistogram (µs), Gristmill's timings only
    statuses: Counter[str]
    retry_after: int  # shed answers (429/503) that carried Retry-After
    wrong: int  # 200 answers whose output was not the caller's
    batch_sum: int
    batch_n: int
    client_cpu_s: float

    def pct(self, q: float, hist: Any = None) -> float | None:
        h = self.latency if hist is None else hist
        if h.get_total_count() == 0:
            return None
        v = h.get_max_value() if q >= 100 else h.get_value_at_percentile(q)
        return round(v / 1000, 1)

    def summary(self) -> dict[str, Any]:
        ok = self.statuses.get("200", 0)
        stages = {
            name: {
                "mean": round(h.get_mean_value() / 1000, 2),
                "p50": self.pct(50, h),
                "p95": self.pct(95, h),
                "p99": self.pct(99, h),
            }
            for name, h in self.stages.items()
            if h.get_total_count()
        }
        return {
            "offered_rps": self.spec.rate,
            "duration_s": self.spec.duration_s,
            "requests": sum(self.statuses.values()),
            "achieved_rps": round(ok / self.window_s, 1) if self.window_s else 0.0,
            "p50_ms": self.pct(50),
            "p95_ms": self.pct(95),
            "p99_ms": self.pct(99),
            "max_ms": self.pct(100),
            "p50_all_ms": self.pct(50, self.latency_all),  # every answer, errors included
            "p95_all_ms": self.pct(95, self.latency_all),
            "p99_all_ms": self.pct(99, self.latency_all),
            "statuses": dict(sorted(self.statuses.items())),
            "errors": sum(n for k, n in self.statuses.items() if k != "200"),
            "shed_with_retry_after": self.retry_after,
            "wrong_outputs": self.wrong,
            "mean_batch_seen_by_request": (
                round(self.batch_sum / self.batch_n, 1) if self.batch_n else None
            ),
            "stages_ms": stages,
            "send_lag_p99_ms": self.pct(99, self.send_lag),
            # When the client fell behind, if it did: a start-up burst shows in the first
            # seconds, a starved client anywhere.
            "send_lag_worst_by_s_ms": [round(v, 1) for v in self.send_lag_by_s],
            "ok_by_s": self.ok_by_s,
            "failed_by_s": self.failed_by_s,
            "client_processes": self.processes,
            "client_cpu_s": round(self.client_cpu_s, 2),
            "client_cpu_cores": round(self.client_cpu_s / self.window_s, 2),
        }


# How long after the last child is ready the shared schedule starts: the release
# reaching every child, not their setup (which the gate waits out, however long).
START_LEAD_S = 0.5


def run_load(spec: LoadSpec, processes: int = 2) -> LoadResult:
    """Drive ``spec`` from ``processes`` spawned processes; block until every answer is in.

    The schedule starts once every child has imported and read its corpus (a gate),
    not at a guessed delay: a child still starting when its first sends fall due sends
    them late, as one burst, and that burst is the run's tail (on a GPU host still
    warming up, spawned children took over the 3 s a fixed delay allowed)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    processes = max(1, processes)
    ctx = mp.get_context("spawn")
    gate = StartGate(ctx, processes)
    with cf.ProcessPoolExecutor(
        processes, mp_context=ctx, initializer=_keep_gate, initargs=(gate,)
    ) as pool:
        futures = [pool.submit(_child, (spec, i, processes)) for i in range(processes)]
        start_mono = gate.open(futures)
        start_wall = time.time() + (start_mono - time.monotonic())
        parts = [f.result() for f in futures]
    res = LoadResult(
        spec=spec,
        processes=processes,
        start_wall=start_wall,
        window_s=max(spec.duration_s, max(p["last_done"] for p in parts) - start_mono),
        latency=new_hist(),
        latency_all=new_hist(),
        send_lag=new_hist(),
        send_lag_by_s=[max(v) for v in zip(*(p["send_lag_by_s"] for p in parts), strict=True)],
        ok_by_s=[sum(v) for v in zip(*(p["ok_by_s"] for p in parts), strict=True)],
        failed_by_s=[sum(v) for v in zip(*(p["failed_by_s"] for p in parts), strict=True)],
        stages={name: new_hist() for name in STAGES + DERIVED},
        statuses=Counter(),
        retry_after=0,
        wrong=0,
        batch_sum=0,
        batch_n=0,
        client_cpu_s=0.0,
    )
    for p in parts:
        res.latency.decode_and_add(p["latency"])
        res.latency_all.decode_and_add(p["latency_all"])
        res.send_lag.decode_and_add(p["send_lag"])
        for name, enc in p["stages"].items():
            res.stages[name].decode_and_add(enc)
        res.statuses.update(p["statuses"])
        res.retry_after += p["retry_after"]
        res.wrong += p["wrong"]
        res.batch_sum += p["batch_sum"]
        res.batch_n += p["batch_n"]
        res.client_cpu_s += p["cpu_s"]
    return res


def raise_fd_limit() -> None:
    """Overload runs hold thousands of sockets open; take the hard limit."""
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def run_in_child(coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """A load-generating child's loop: all the file descriptors it may have, and uvloop
    where installed (the event loop the API itself runs on: less client CPU a request)."""
    raise_fd_limit()
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


class StartGate:
    """Every child reports ready, then all read one start time (monotonic clock, which
    processes of one host share)."""

    def __init__(self, ctx: Any, processes: int) -> None:
        self._ready = ctx.Semaphore(0)
        self._go = ctx.Event()
        self._start = ctx.Value("d", 0.0)
        self.processes = processes

    def wait(self) -> float:
        """In a child, its setup done: the schedule's start."""
        self._ready.release()
        self._go.wait()
        return float(self._start.value)

    def open(self, futures: list[Any], timeout_s: float = 300.0) -> float:
        """In the parent: wait for every child (a child that failed raises here), then
        start the schedule ``START_LEAD_S`` from now."""
        deadline = time.monotonic() + timeout_s
        for _ in range(self.processes):
            while not self._ready.acquire(timeout=0.5):
                for f in futures:
                    if f.done():
                        f.result()  # raises a child's setup error
                if time.monotonic() > deadline:
                    raise TimeoutError("load generator children did not start in time")
        self._start.value = start = time.monotonic() + START_LEAD_S
        self._go.set()
        return start


_GATE: StartGate | None = None


def _keep_gate(gate: StartGate) -> None:
    global _GATE
    _GATE = gate


def _child(args: tuple[LoadSpec, int, int]) -> dict[str, Any]:
    spec, index, n = args
    check = answer_check(spec)  # the slow part of a child's setup: the corpus
    assert _GATE is not None
    start = _GATE.wait()
    return run_in_child(_drive(spec, index, n, start, check))


async def _drive(spec: LoadSpec, index: int, n: int, start: float, check: Any) -> dict[str, Any]:
    import resource

    lat, lat_all, lag = new_hist(), new_hist(), new_hist()
    lag_by_s: list[float] = [0.0] * (int(spec.duration_s) + 1)  # the worst send each second
    ok_by_s = [0] * len(lag_by_s)
    failed_by_s = [0] * len(lag_by_s)
    stages = {name: new_hist() for name in STAGES + DERIVED}
    statuses: Counter[str] = Counter()
    acc = {"retry_after": 0, "wrong": 0, "batch_sum": 0, "batch_n": 0}
    last_done = start
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=spec.timeout_s)
    hdrs = {**spec.headers, "Content-Type": "application/json"}

    def rec(h: Any, ms: float) -> None:
        h.record_value(min(HDR_MAX_US, max(1, round(ms * 1000))))

    raw_pool = RawPool(spec.url, spec.headers, spec.timeout_s) if spec.client == "raw" else None

    async def one(j: int, due: float) -> None:
        nonlocal last_done
        text = check.text(j)
        late_ms = (time.monotonic() - due) * 1000
        rec(lag, late_ms)
        second = min(len(lag_by_s) - 1, int(due - start))
        lag_by_s[second] = max(lag_by_s[second], late_ms)
        body: dict[str, Any] | None = None
        try:
            payload = orjson.dumps(check.body(text))
            if raw_pool is not None:
                answer = await raw_pool.post(payload)
                status, raw, shed_after = answer.status, answer.body, answer.retry_after
            else:
                async with client.post(spec.url, data=payload) as r:
                    status, raw = r.status, await r.read()
                    shed_after = "Retry-After" in r.headers
            key = str(status)
            if status in (429, 503) and shed_after:
                acc["retry_after"] += 1
            if status == 200:
                body = orjson.loads(raw)
        except TimeoutError:
            key = "client_timeout"
        except (aiohttp.ClientError, HttpError, OSError):
            key = "client_error"
        done = time.monotonic()
        last_done = max(last_done, done)
        ms = (done - due) * 1000
        statuses[key] += 1
        (ok_by_s if key == "200" else failed_by_s)[second] += 1
        rec(lat_all, ms)
        if body is None:
            return
        rec(lat, ms)
        if not check.right(j, body):
            acc["wrong"] += 1
        if body.get("batch_size"):
            acc["batch_sum"] += body["batch_size"]
            acc["batch_n"] += 1
        t = body.get("timings")
        if t and all(t.get(k) is not None for k in (*STAGES, "total_ms")):
            for k in STAGES:
                rec(stages[k], t[k])
            total = t["total_ms"]
            rec(stages["respond_ms"], total - sum(t[k] for k in STAGES))
            rec(stages["client_http_ms"], ms - total)
            rec(stages["overhead_server_ms"], total - t["batch_wait_ms"] - t["compute_ms"])
            rec(stages["overhead_client_ms"], ms - t["batch_wait_ms"] - t["compute_ms"])

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    tasks: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=hdrs) as client:
        total = int(spec.rate * spec.duration_s)
        for j in range(index, total, n):
            due = start + j / spec.rate
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if len(tasks) >= spec.max_inflight:
                statuses["client_overflow"] += 1
                failed_by_s[min(len(failed_by_s) - 1, int(due - start))] += 1
                continue
            task = asyncio.create_task(one(j, due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(list(tasks))
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "latency": lat.encode(),
        "latency_all": lat_all.encode(),
        "send_lag": lag.encode(),
        "send_lag_by_s": lag_by_s,
        "ok_by_s": ok_by_s,
        "failed_by_s": failed_by_s,
        "stages": {k: h.encode() for k, h in stages.items()},
        "statuses": dict(statuses),
        "last_done": last_done,
        "cpu_s": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime),
        **acc,
    }


class SimCheck:
    """Inputs ``<tag>-<j>``; the answer is sim's digest of the input."""

    def __init__(self, spec: LoadSpec) -> None:
        from core.models.sim import sim_output

        self.spec = spec
        self._out = sim_output

    def text(self, j: int) -> str:
        return f"{self.spec.tag}-{j}"

    def body(self, text: str) -> dict[str, Any]:
        return {"model": self.spec.model, "input": text}

    def right(self, j: int, body: dict[str, Any]) -> bool:
        return bool(body.get("output") == self._out(self.text(j)))


def answer_check(spec: LoadSpec) -> Any:
    if not spec.corpus:
        return SimCheck(spec)
    from bench.corpus import VectorCheck

    return VectorCheck(spec.corpus, spec.model, spec.wire)
