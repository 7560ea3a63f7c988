"""Microseconds the scheduler spends per Kafka message in ``scheduler.core.intake.decode``.

The message is the canonical one the API writes (``RequestMessage.encode`` of a paid
tenant's sync request, as ``bench.store.persist`` produces it): distinct request ids
and inputs, one tenant, the model's normalized params. Two loops, each run ``--runs``
times and reported as the median:

* ``tight``: one message's bytes decoded over and over (nothing kept: the call's own
  cost);
* ``list``: ``--batch`` distinct messages decoded into a list that is kept until the
  batch is done, as ``SchedulerService.accept`` does with what a lane fetched (the
  short-lived containers each message leaves behind then drive the cyclic GC);
* ``queued``: as ``list``, but the last ``--queued`` requests stay alive, as requests
  waiting in the batcher and the persister do: the older collections walk them;
* ``loads``: ``orjson.loads`` alone over the same list, the floor ``decode`` cannot go
  below.

``--gc-tuned`` applies the scheduler's GC settings (``core/gc_tuning.py``) first.

    .venv/bin/python -m bench.store.intake_decode [--model sim] [--runs 7]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson

from core.config import Settings
from core.messages import RequestMessage
from core.models.catalog import build_specs
from scheduler.core.batcher import Pending
from scheduler.core.intake import decode

SENTENCE = "the quick brown fox jumps over the lazy dog near the river bank at dawn #{i}"
TP = ("gm.requests.paid", 0)


def messages(model: str, n: int) -> list[bytes]:
    specs = build_specs(Settings())
    spec = max(specs[model].values(), key=lambda s: s.version)
    tenant = str(uuid.uuid4())
    now = time.time()
    out = []
    for i in range(n):
        text = SENTENCE.format(i=i)
        msg = RequestMessage(
            request_id=str(uuid.uuid4()),
            tenant_id=tenant,
            priority="paid",
            model=spec.name,
            version=spec.version,
            input=spec.message_input(text),
            params=spec.normalize_params({}),
            deadline=now + 3600,
            received_at=now,
        )
        out.append(msg.encode())
    return out


def per_message_us(fn: Callable[[], int], runs: int) -> float:
    """Median over ``runs`` of microseconds per message; ``fn`` returns its count."""
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        n = fn()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="sim")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--batch", type=int, default=500, help="messages a fetch hands over")
    ap.add_argument("--batches", type=int, default=40, help="fetches per run")
    ap.add_argument("--queued", type=int, default=20_000, help="requests kept alive")
    ap.add_argument("--gc-tuned", action="store_true")
    args = ap.parse_args()
    specs = build_specs(Settings())
    raws = messages(args.model, args.batch * args.batches)
    fetches = [raws[i : i + args.batch] for i in range(0, len(raws), args.batch)]
    if args.gc_tuned:
        from core.gc_tuning import tune_gc

        tune_gc()
    now = time.time()

    def one(raw: bytes) -> Any:
        return decode(raw, tp=TP, offset=7, produced_at=now, now=now, specs=specs)

    assert isinstance(one(raws[0]), Pending), one(raws[0])

    def tight() -> int:
        raw = raws[0]
        n = len(raws)
        for _ in range(n):
            one(raw)
        return n

    def listed() -> int:
        for fetch in fetches:
            got = [one(raw) for raw in fetch]
            del got
        return len(raws)

    def queued() -> int:
        alive: deque[Any] = deque(maxlen=args.queued)
        for fetch in fetches:
            alive.extend([one(raw) for raw in fetch])
        return len(raws)

    def loads() -> int:
        for fetch in fetches:
            got = [orjson.loads(raw) for raw in fetch]
            del got
        return len(raws)

    result = {
        "model": args.model,
        "message_bytes": len(raws[0]),
        "gc": "tuned" if args.gc_tuned else f"default {gc.get_threshold()}",
        "tight_us": round(per_message_us(tight, args.runs), 2),
        "list_us": round(per_message_us(listed, args.runs), 2),
        "queued_us": round(per_message_us(queued, args.runs), 2),
        "loads_us": round(per_message_us(loads, args.runs), 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
