"""The persist path's own CPU at GPU rate, with PostgreSQL left out (issue 19 item 5).

PostgreSQL cannot run on the GPU machine, so the store is measured in two halves. This
script is the scheduler's half: everything the persister does for a batch before the
bytes leave for the database, at the rate a GPU produces results:

* ``write_rows`` (scheduler/runtime/rows.py): a request-log row per item, the batch's vectors
  converted to float32 bytes in one pass;
* ``column_arrays`` (results/store.py) and the driver's binary encoding of every
  parameter (psycopg's own dumpers, as ``cur.execute`` runs them);
* for sync batches, the announcements (results/announce.py): every answer inlined.

Batches come from ``--source``: ``synthetic`` (default: random float32 rows of the
model's shape, made ahead, so only the persist path is timed; runs anywhere) or
``model`` (the real embedding model on CUDA in a worker process, fed token ids as the
API tier makes them: the GPU's own rate, the persist threads racing it). ``--threads``
persist threads (the persister's pool: 3) share the work as they do in the scheduler.

The other half, PostgreSQL's, is measured on the CPU machine by bench/store/persist.py
(rows/s through Kafka and the scheduler into a real database, and PostgreSQL's CPU per
row); docs/bench/store.md puts the two together.

Needs neither PostgreSQL nor Kafka (nothing connects to either), only numpy, torch
and the project's Python dependencies. With ``--model-dir`` (the all-MiniLM-L6-v2
files) and no ``--source``, it runs all three: synthetic job batches, synthetic sync
batches, and the model's job batches, into one JSON:

    python3 -m bench.store.gpu_feed --model-dir .modelcache/all-minilm-l6-v2 \\
        --out gpu_feed.json
    python3 -m bench.store.gpu_feed --seconds 20 --out gpu_feed.json   # synthetic only
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from psycopg.adapt import PyFormat, Transformer

from core.messages import RequestMessage
from core.vocab import RequestStatus
from results.store import _OUTPUT, _VECTOR, announcements, column_arrays, insert_parameters
from scheduler.core.batcher import Batch, BatchKey, FlushReason, Pending
from scheduler.core.plans import Write
from scheduler.runtime.rows import write_rows

DIM = 384
MODEL = "all-minilm-l6-v2"


def _pending(n: int, priority: str, key: BatchKey) -> list[Pending]:
    now = time.time()
    job = str(uuid.uuid4()) if priority == "jobs" else None
    out = []
    for i in range(n):
        m = RequestMessage(
            request_id=str(uuid.uuid4()),
            tenant_id="5f1c0f7e-4f3a-4a39-9c53-6f0c3f6e2a11",
            priority=priority,
            model=MODEL,
            version="1",
            input=f"a sentence to embed, number {i}",
            params={"normalize": True},
            deadline=now + 60,
            # Sync requests arrive one by one; a job's items share its acceptance time.
            received_at=now if job else now + i * 1e-5,
            job_id=job,
            item_index=i if job else None,
            extra={"produced_at": now},
        )
        out.append(Pending(m, key, 1, ("gristmill.requests." + priority, i % 6), i, now))
    return out


def persist_cpu(w: Write, tx: Any) -> int:
    """Everything the persister does with a batch's result before the database (``tx``: a
    psycopg Transformer, the driver's own parameter encoding)."""
    rows, _ = write_rows(w)
    arrays = column_arrays(rows)
    _, params = insert_parameters(arrays)
    tx.dump_sequence(params, [PyFormat.BINARY] * len(params))
    if w.items[0].msg.job_id is None:
        written = [True] * len(rows)
        announcements(rows, arrays[_OUTPUT], arrays[_VECTOR], written, rows[0]["received_at"])
    return len(rows)


def _gpu_worker(out: Any, batch: int, seconds: float, model_dir: str) -> None:
    """A worker process: the embedding model on CUDA, fed token ids, as fast as it goes.
    Its first message describes the device."""
    import torch

    from core.config import Settings
    from core.models.catalog import build_specs
    from core.models.text_tokenizer import shared_tokenizer
    from core.models.token_ids import tokenized_input
    from workers.models.loader import load_model

    settings = Settings(embed_max_batch=batch, embed_model_dir=model_dir)
    spec = build_specs(settings)[MODEL]["1"]
    model = load_model(spec, settings)
    model.warmup()
    cuda = torch.cuda.is_available()
    out.put(
        {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__}
    )
    tok = shared_tokenizer(settings.embed_model_dir or None, 256)
    assert tok is not None
    texts = [f"a sentence to embed about the number {i} and what follows" for i in range(batch)]
    inputs = [tokenized_input(t, tok.encode(t).ids) for t in texts]
    end = time.time() + seconds
    while time.time() < end:
        vecs = model.predict(inputs, {"normalize": True})
        out.put(np.asarray(vecs, dtype=np.float32))
    out.put(None)


def run(args: argparse.Namespace) -> dict[str, Any]:
    key = BatchKey(MODEL, "1", (("normalize", True),))
    work: queue.Queue[tuple[list[Pending], Any] | None] = queue.Queue(maxsize=args.threads * 4)
    done = [0] * args.threads
    stop = threading.Event()

    def persist_thread(k: int) -> None:
        tx = Transformer()
        while True:
            item = work.get()
            if item is None:
                return
            items, outputs = item
            batch = Batch(key, items, time.time(), FlushReason.FULL)
            now = time.time()
            w = Write(
                0,
                RequestStatus.SUCCEEDED,
                items,
                batch=batch,
                outputs=outputs,
                compute=(now, now),
                worker_id="gpu",
                batch_row=True,
            )
            done[k] += persist_cpu(w, tx)

    threads = [threading.Thread(target=persist_thread, args=(k,)) for k in range(args.threads)]
    for t in threads:
        t.start()
    priority = "jobs" if args.kind == "job" else "paid"
    pendings = [_pending(args.batch, priority, key) for _ in range(8)]
    cpu0 = os.times()
    device: dict[str, Any] = {}
    if args.source == "synthetic":
        rng = np.random.default_rng(0)
        outs = [rng.standard_normal((args.batch, DIM)).astype(np.float32) for _ in range(8)]
        t0 = time.perf_counter()
        i = 0
        while time.perf_counter() - t0 < args.seconds:
            work.put((pendings[i % 8], outs[i % 8]))
            i += 1
        produced = i * args.batch
    else:
        ctx = mp.get_context("spawn")
        q: Any = ctx.Queue(maxsize=8)
        proc = ctx.Process(
            target=_gpu_worker, args=(q, args.batch, args.seconds + 60, args.model_dir or "")
        )
        proc.start()
        device = q.get()  # warm-up done: time from the first result
        first = q.get()
        t0 = time.perf_counter()
        i = 0
        produced = 0
        got = first
        while got is not None and time.perf_counter() - t0 < args.seconds:
            work.put((pendings[i % 8], got))
            produced += len(got)
            i += 1
            got = q.get()
        proc.terminate()
    for _ in threads:
        work.put(None)
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu1 = os.times()
    stop.set()
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    rows = sum(done)
    return {
        **device,
        "source": args.source,
        "kind": args.kind,
        "batch": args.batch,
        "threads": args.threads,
        "seconds": round(wall, 2),
        "rows": rows,
        "rows_per_s": round(rows / wall, 1),
        "offered_rows_per_s": round(produced / wall, 1),
        "cpu_s": round(cpu, 2),
        "cpu_us_per_row": round(cpu / rows * 1e6, 2),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--source",
        choices=("synthetic", "model"),
        help="default: synthetic; with --model-dir, all three runs (module doc)",
    )
    ap.add_argument("--kind", choices=("job", "sync"), default="job")
    ap.add_argument("--model-dir", help="the all-MiniLM-L6-v2 files (for --source model)")
    ap.add_argument("--batch", type=int, default=1024, help="rows a batch (the GPU's 1024)")
    ap.add_argument("--threads", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.source is not None or not args.model_dir:
        result: Any = run(
            argparse.Namespace(**{**vars(args), "source": args.source or "synthetic"})
        )
    else:
        plan = [("synthetic", "job"), ("synthetic", "sync"), ("model", "job")]
        result = {
            "runs": [
                run(argparse.Namespace(**{**vars(args), "source": src, "kind": kind}))
                for src, kind in plan
            ]
        }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
