"""Open-loop sync traffic for runs of minutes to hours, counted by the second.

Like ``bench.openloop.run_load`` (requests start on schedule, over bench/rawhttp.py and
uvloop; latency from the intended send time; several client processes share one
schedule), but what a long run needs to
show *when* something went wrong: every answer is counted in the second it was due, by
outcome (``outcome``: 200, or the refusal's reason as the answer's message says it), and
latencies of 200 answers go into one HdrHistogram per ``hist_s`` window. A client gives
up after ``timeout_s`` (counted ``no_answer``), as an operator's client would.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson

from bench.openloop import HDR_MAX_US, new_hist, run_in_child
from bench.rawhttp import HttpError, RawPool

# The start of a refusal's message -> its reason (core/errors.py's words where the API
# has one; the request log's refusal counts say the same from the server's side).
_MESSAGES = (
    ("overloaded: this API instance's event loop", "instance_overload"),
    ("this API instance is at capacity", "instance_capacity"),
    ("overloaded: the schedulers' buffers", "buffer"),
    ("overloaded:", "predicted_delay"),
    ("cannot finish within its deadline", "unmeetable_deadline"),
    ("results cannot be delivered", "results_unreachable"),
    ("cannot reach the database to check the API key", "auth_database"),
    ("the database is busy", "database_busy"),
    ("the database is unavailable", "database"),
    ("no result within timeout_ms", "deadline"),
    ("the deadline passed before a worker", "expired"),
    ("not ready", "not_ready"),
)


def outcome(status: int, raw: bytes) -> str:
    """``"200"``, or ``"<status> <reason>"`` from the answer's message. Pure."""
    if status == 200:
        return "200"
    try:
        message = str(orjson.loads(raw)["error"]["message"])
    except Exception:
        message = raw[:80].decode(errors="replace")
    for start, reason in _MESSAGES:
        if message.startswith(start):
            return f"{status} {reason}"
    return f"{status} other"


@dataclass(frozen=True)
class TrafficSpec:
    url: str  # the API's base URL
    key: str
    rate: float  # requests/s, all client processes together
    duration_s: float
    tag: str  # inputs are f"{tag}-{i}": unique, and each answer can be checked
    model: str = "sim"
    timeout_s: float = 30.0
    hist_s: float = 10.0
    # Per client process; beyond it a request is not sent and counts as client_overflow.
    max_inflight: int = 20_000


@dataclass
class Traffic:
    """What came back, merged over the client processes."""

    spec: TrafficSpec
    start_wall: float  # time.time() of the schedule's start
    seconds: list[Counter[str]] = field(default_factory=list)  # by the second a request was due
    hists: list[Any] = field(default_factory=list)  # HdrHistogram (us) of 200s per hist_s
    wrong: int = 0
    client_cpu_s: float = 0.0

    def window(self, t0: float, t1: float) -> Counter[str]:
        """Outcomes of the requests due in [t0, t1) seconds from the start."""
        out: Counter[str] = Counter()
        for c in self.seconds[int(t0) : int(t1)]:
            out.update(c)
        return out

    def latency(self, t0: float, t1: float) -> Any:
        """One histogram of the 200s due in [t0, t1) (whole hist_s windows)."""
        h = new_hist()
        step = self.spec.hist_s
        for i in range(int(t0 // step), int(-(-t1 // step))):
            if 0 <= i < len(self.hists):
                h.add(self.hists[i])
        return h


def pct_ms(hist: Any, q: float) -> float | None:
    if hist.get_total_count() == 0:
        return None
    return round(hist.get_value_at_percentile(q) / 1000, 1)


def run_traffic(spec: TrafficSpec, processes: int = 1) -> Traffic:
    """Drive ``spec`` from ``processes`` spawned processes; block until every answer is in."""
    import concurrent.futures as cf
    import multiprocessing as mp

    processes = max(1, processes)
    start_mono = time.monotonic() + 2.0  # spawned children take ~1 s to import
    start_wall = time.time() + (start_mono - time.monotonic())
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(processes, mp_context=ctx) as pool:
        parts = list(pool.map(_child, [(spec, i, processes, start_mono) for i in range(processes)]))
    n_sec = int(-(-spec.duration_s // 1))
    n_hist = int(-(-spec.duration_s // spec.hist_s))
    out = Traffic(spec, start_wall, [Counter() for _ in range(n_sec)])
    out.hists = [new_hist() for _ in range(n_hist)]
    for p in parts:
        for i, c in enumerate(p["seconds"]):
            out.seconds[i].update(c)
        for i, enc in enumerate(p["hists"]):
            out.hists[i].decode_and_add(enc)
        out.wrong += p["wrong"]
        out.client_cpu_s += p["cpu_s"]
    return out


def _child(args: tuple[TrafficSpec, int, int, float]) -> dict[str, Any]:
    return run_in_child(_drive(*args))


async def _drive(spec: TrafficSpec, index: int, n: int, start: float) -> dict[str, Any]:
    import resource

    from core.models.sim import sim_output

    n_sec = int(-(-spec.duration_s // 1))
    seconds: list[Counter[str]] = [Counter() for _ in range(n_sec)]
    hists = [new_hist() for _ in range(int(-(-spec.duration_s // spec.hist_s)))]
    wrong = 0
    # bench/rawhttp.py: a tenth of aiohttp's CPU a request, so an hour at 1,000 req/s
    # measures the system, not the load generator starving beside it.
    pool = RawPool(f"{spec.url}/v1/infer", {"Authorization": f"Bearer {spec.key}"}, spec.timeout_s)

    async def one(j: int, due: float) -> None:
        nonlocal wrong
        text = f"{spec.tag}-{j}"
        sec = int(j / spec.rate)
        raw = b""
        try:
            answer = await pool.post(orjson.dumps({"model": spec.model, "input": text}))
            raw = answer.body
            key = outcome(answer.status, raw)
        except TimeoutError:
            key = "no_answer"
        except (HttpError, OSError):
            key = "conn"
        seconds[min(sec, n_sec - 1)][key] += 1
        if key != "200":
            return
        ms = (time.monotonic() - due) * 1000
        hists[min(int(j / spec.rate / spec.hist_s), len(hists) - 1)].record_value(
            min(HDR_MAX_US, max(1, round(ms * 1000)))
        )
        if orjson.loads(raw).get("output") != sim_output(text):
            wrong += 1

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    tasks: set[asyncio.Task[None]] = set()
    for j in range(index, int(spec.rate * spec.duration_s), n):
        due = start + j / spec.rate
        wait = due - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        if len(tasks) >= spec.max_inflight:
            seconds[min(int(j / spec.rate), n_sec - 1)]["client_overflow"] += 1
            continue
        task = asyncio.create_task(one(j, due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(list(tasks))
    pool.close()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "seconds": [dict(c) for c in seconds],
        "hists": [h.encode() for h in hists],
        "wrong": wrong,
        "cpu_s": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime),
    }
