"""The three ways of serving the same open-loop arrivals, each timed the same way.

* continuous: ``Engine.serve`` with the continuous-batching policy (joins every step).
* static: the same engine and runner, but a batch is formed only when the previous
  one has finished entirely (sequences that finish early stop computing; new
  arrivals still wait for the batch's longest member), KV reserved for the worst case.
* plain: one request at a time, contiguous KV cache (workers/models/causal_lm/plain.py).

A feeder thread puts each request in at its arrival time (open loop: overload shows
as waiting, not as a slower client), or, with ``concurrency``, keeps that many in
flight (closed loop: the next request goes in when one finishes, its arrival then);
times are ``time.monotonic`` throughout.
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from bench.generation.static import StaticBatcher
from scheduler.core.generation.config import PolicyConfig
from scheduler.core.generation.engine import Command, Engine, StepStats
from scheduler.core.generation.events import Event, Finished, Preempted, Token
from scheduler.core.generation.policy import ContinuousBatcher
from scheduler.core.generation.sequence import GenRequest
from workers.models.causal_lm.model import CausalLM
from workers.models.causal_lm.plain import stream
from workers.models.causal_lm.runner import ModelRunner
from workers.models.causal_lm.tokenizer import Codec


@dataclass
class Timing:
    arrived: float
    first: float | None = None
    done: float | None = None
    tokens: int = 0
    preemptions: int = 0


@dataclass
class ModeResult:
    mode: str
    timings: dict[str, Timing]
    started: float
    steps: list[StepStats] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        t = [x for x in self.timings.values() if x.done is not None and x.first is not None]
        end = max((x.done for x in t if x.done is not None), default=self.started)
        tokens = sum(x.tokens for x in t)
        ttft = sorted(x.first - x.arrived for x in t if x.first is not None)
        itl = [
            (x.done - x.first) / (x.tokens - 1)
            for x in t
            if x.tokens > 1 and x.done is not None and x.first is not None
        ]
        busy = [s for s in self.steps if s.tokens]

        def pct(xs: list[float], q: float) -> float | None:
            return round(xs[min(len(xs) - 1, int(q * len(xs)))], 4) if xs else None

        return {
            "mode": self.mode,
            "requests": len(self.timings),
            "finished": len(t),
            "output_tokens": tokens,
            "makespan_s": round(end - self.started, 3),
            "tokens_per_s": round(tokens / max(end - self.started, 1e-9), 1),
            "ttft_p50_s": pct(ttft, 0.5),
            "ttft_p95_s": pct(ttft, 0.95),
            "itl_mean_ms": round(1000 * statistics.fmean(itl), 2) if itl else None,
            "itl_p95_ms": round(1000 * sorted(itl)[int(0.95 * len(itl))], 2) if itl else None,
            "preemptions": sum(x.preemptions for x in t),
            "steps": len(busy),
            "mean_batch": round(statistics.fmean(s.sequences for s in busy), 1) if busy else 0,
            "mean_step_tokens": round(statistics.fmean(s.tokens for s in busy), 1) if busy else 0,
            "mean_step_ms": round(1000 * statistics.fmean(s.step_s for s in busy), 2)
            if busy
            else None,
        }


def _feed(
    arrivals: list[tuple[float, GenRequest]],
    put: Callable[[GenRequest], None],
    timings: dict[str, Timing],
    t0: float,
) -> None:
    for offset, req in arrivals:
        delay = t0 + offset - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        at = t0 + offset  # the intended time: lateness of the feeder is not hidden
        timings[req.seq_id] = Timing(arrived=at)
        put(replace(req, arrived_at=at))


def _feed_closed(
    arrivals: list[tuple[float, GenRequest]],
    put: Callable[[GenRequest], None],
    timings: dict[str, Timing],
    t0: float,
    slots: threading.Semaphore,
    stop: threading.Event,
) -> None:
    """Closed loop: a request goes in whenever one of the ``slots`` frees (offsets unused)."""
    time.sleep(max(0.0, t0 - time.monotonic()))
    for _, req in arrivals:
        while not slots.acquire(timeout=0.5):
            if stop.is_set():
                return
        at = time.monotonic()
        timings[req.seq_id] = Timing(arrived=at)
        put(replace(req, arrived_at=at))


def run_engine(
    mode: str,
    model: CausalLM,
    codec: Codec,
    cfg: PolicyConfig,
    arrivals: list[tuple[float, GenRequest]],
    timeout_s: float,
    concurrency: int | None = None,
    cudnn_attention: bool = False,
) -> ModeResult:
    cls = StaticBatcher if mode == "static" else ContinuousBatcher
    if mode == "static":
        cfg = cfg.model_copy(update={"kv_overcommit": 1.0})
    policy = cls(cfg, codec.decode, codec.eos_id)
    runner = ModelRunner(model, cfg.num_blocks, cfg.block_size, cudnn_attention)
    engine = Engine(policy, runner)
    inbox: queue.Queue[Command] = queue.Queue()
    timings: dict[str, Timing] = {}
    res = ModeResult(mode, timings, 0.0)
    n_done = threading.Semaphore(0)
    slots = threading.Semaphore(concurrency or 0)

    def sink(events: list[Event]) -> None:
        for e in events:
            t = timings[e.seq_id]
            if isinstance(e, Token):
                t.tokens += 1
                if t.first is None:
                    t.first = e.at
            elif isinstance(e, Preempted):
                t.preemptions += 1
            elif isinstance(e, Finished):
                t.done = e.finished_at
                n_done.release()
                slots.release()

    stop = threading.Event()
    server = threading.Thread(
        target=engine.serve,
        args=(inbox, sink, stop),
        kwargs={"on_step": res.steps.append},
        daemon=True,
    )
    server.start()
    res.started = time.monotonic() + 0.05
    feeder = threading.Thread(
        target=_feed_closed if concurrency else _feed,
        args=(arrivals, inbox.put, timings, res.started, slots, stop)
        if concurrency
        else (arrivals, inbox.put, timings, res.started),
    )
    feeder.start()
    deadline = res.started + timeout_s
    for _ in arrivals:
        if not n_done.acquire(timeout=max(0.0, deadline - time.monotonic())):
            break
    stop.set()
    feeder.join()
    server.join()
    return res


def run_plain(
    model: CausalLM, arrivals: list[tuple[float, GenRequest]], timeout_s: float
) -> ModeResult:
    inbox: queue.Queue[GenRequest] = queue.Queue()
    timings: dict[str, Timing] = {}
    res = ModeResult("plain", timings, time.monotonic() + 0.05)
    feeder = threading.Thread(target=_feed, args=(arrivals, inbox.put, timings, res.started))
    feeder.start()
    deadline = res.started + timeout_s
    for _ in arrivals:
        try:
            req = inbox.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        t = timings[req.seq_id]
        for _token in stream(model, req.prompt, req.max_tokens):
            t.tokens += 1
            if t.first is None:
                t.first = time.monotonic()
        t.done = time.monotonic()
        if t.done > deadline:
            break
    feeder.join()
    return res
