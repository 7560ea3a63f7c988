"""The request log written and read back as the sync path does, with random request ids
(UUIDv4, as before decision 72) against time-ordered ones (UUIDv7, core/ids.py).

Each variant on a fresh durable PostgreSQL at its default settings (128 MB of shared
buffers), the schema at head: ``--threads`` writers store batches of ``--batch`` small
answers with the scheduler's own write (results/store.py ``persist``), and one reader
fetches every stored batch back by its ids within its receipt window, as an API process
does for the answers announced by id (results/requests.py). Every ``--step`` rows: the
rows written and fetched a second over the step, the fetch's p95, and per row the WAL
bytes, full-page images and blocks read from outside the buffers (pg_stat_wal,
pg_statio_user_indexes), with the primary key's size. On the GPU host the whole system
collapsed at 15,000 req/s with PostgreSQL waiting on ``LWLock:BufferMapping`` and data
file reads once the log held a few million rows (docs/bench/gpu-host.md, r12).

    flock /tmp/gristmill-heavy.lock .venv/bin/python -m bench.store.id_order \\
        --rows 3000000 --out docs/bench/store       # ~6 min on the 2-core box
    .venv/bin/python -m bench.store.id_order --plot docs/bench/store/id-order.json
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from bench.store.batch_rows import request_row
from bench.store.persist import machine
from core.config import Settings
from core.ids import uuid7
from gristmill.devservices import PostgresServer
from gristmill.migrate import migrate_database
from results.db import make_engine
from results.schema import RequestRow
from results.store import persist

IDS: dict[str, Callable[[], str]] = {"v4": lambda: str(uuid.uuid4()), "v7": uuid7}
FETCH = (
    "SELECT request_id, status, output FROM requests"
    " WHERE request_id = ANY(%s::uuid[]) AND received_at BETWEEN %s AND %s"
)


def _batch(new_id: Callable[[], str], tenant: str, n: int) -> list[RequestRow]:
    at = datetime.now(UTC)
    return [
        request_row(
            tenant,
            at,
            request_id=new_id(),
            model="sim",
            params={},
            input={"x": i},
            output={"y": i},
            output_vector=None,
        )
        for i in range(n)
    ]


def _counters(dsn: str) -> dict[str, float]:
    with psycopg.connect(dsn) as c:
        # Bytes from the WAL's position (exact); full-page images from the statistics,
        # which backends report up to a second late (steps are longer than that).
        wal = c.execute(
            "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, wal_fpi FROM pg_stat_wal"
        ).fetchone()
        idx = c.execute(
            "SELECT coalesce(sum(idx_blks_read), 0), coalesce(sum(idx_blks_hit), 0)"
            " FROM pg_statio_user_indexes WHERE indexrelname LIKE 'requests%%pkey'"
        ).fetchone()
        size = c.execute(
            "SELECT coalesce(sum(pg_relation_size(indexrelid)), 0) FROM pg_stat_user_indexes"
            " WHERE indexrelname LIKE 'requests%%pkey'"
        ).fetchone()
        ckpt = c.execute(
            "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
        ).fetchone()
    assert wal and idx and size and ckpt
    return {
        "wal_bytes": float(wal[0]),
        "wal_fpi": float(wal[1]),
        "pk_blks_read": float(idx[0]),
        "pk_blks_hit": float(idx[1]),
        "pk_mb": float(size[0]) / 2**20,
        "checkpoints": float(ckpt[0]),
    }


def run_variant(variant: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix=f"id-order-{variant}-") as work:
        Path(work).chmod(0o711)  # the server's own user reaches its data dir through it
        pg = PostgresServer(Path(work) / "pg", fast=False)
        pg.start()
        try:
            settings = Settings(database_url=pg.url)
            migrate_database(settings)
            engine = make_engine(pg.url, pool_size=args.threads + 1)
            with psycopg.connect(pg.dsn, autocommit=True) as c:
                tenant = str(
                    c.execute(
                        "INSERT INTO tenants (name, tier) VALUES ('bench', 'paid') RETURNING id"
                    ).fetchone()[0]  # type: ignore[index]
                )
            return _fill(pg.dsn, engine, IDS[variant], tenant, variant, args)
        finally:
            pg.stop()


def _fill(
    dsn: str, engine: Any, new_id: Callable[[], str], tenant: str, variant: str, a: Any
) -> list[dict[str, Any]]:
    written = [0]
    fetched = [0]
    lat: list[float] = []
    lock = threading.Lock()
    stored: queue.Queue[list[str] | None] = queue.Queue(maxsize=64)
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            rows = _batch(new_id, tenant, a.batch)
            persist(engine, rows, None)
            with lock:
                written[0] += len(rows)
                if written[0] >= a.rows:
                    stop.set()
            stored.put([r["request_id"] for r in rows])

    def reader() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while (ids := stored.get()) is not None:
                now = datetime.now(UTC)
                t = time.perf_counter()
                got = c.execute(FETCH, (ids, now - timedelta(minutes=1), now)).fetchall()
                with lock:
                    lat.append(time.perf_counter() - t)
                    fetched[0] += len(got)

    ws = [threading.Thread(target=writer) for _ in range(a.threads)]
    rd = threading.Thread(target=reader)
    rd.start()
    for w in ws:
        w.start()
    rows: list[dict[str, Any]] = []
    before, t0, at_rows = _counters(dsn), time.perf_counter(), 0
    while not stop.is_set() or written[0] - at_rows >= a.step // 2:
        time.sleep(0.5)
        if written[0] - at_rows < a.step and not stop.is_set():
            continue
        now, t1 = _counters(dsn), time.perf_counter()
        with lock:
            n_w, n_f, ls = written[0], fetched[0], sorted(lat)
            lat.clear()
            fetched[0] = 0
        step = max(1, n_w - at_rows)
        row = {
            "variant": variant,
            "rows": n_w,
            "written_per_s": round(step / (t1 - t0)),
            "fetched_per_s": round(n_f / (t1 - t0)),
            "fetch_ms_p50": round(1000 * statistics.median(ls), 2) if ls else None,
            "fetch_ms_p95": round(1000 * ls[int(0.95 * (len(ls) - 1))], 2) if ls else None,
            "wal_bytes_per_row": round((now["wal_bytes"] - before["wal_bytes"]) / step),
            "fpi_per_1k_rows": round(1000 * (now["wal_fpi"] - before["wal_fpi"]) / step, 1),
            "pk_blks_read_per_1k_rows": round(
                1000 * (now["pk_blks_read"] - before["pk_blks_read"]) / step, 1
            ),
            "pk_mb": round(now["pk_mb"], 1),
            "checkpoints": int(now["checkpoints"] - before["checkpoints"]),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
        before, t0, at_rows = now, t1, n_w
        if stop.is_set():
            break
    for w in ws:
        w.join()
    stored.put(None)
    rd.join()
    return rows


def plot(path: Path, out: Path) -> None:
    """Per variant, against the log's size: the primary key's blocks read from outside
    the buffers, and the full-page images written, per 1,000 rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = json.loads(path.read_text())["rows"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    panels = (
        ("pk_blks_read_per_1k_rows", "primary key blocks read / 1k rows"),
        ("fpi_per_1k_rows", "full-page images / 1k rows"),
        ("written_per_s", "rows written / s (the 2-core box: Python-bound)"),
    )
    for ax, (key, label) in zip(axes, panels, strict=True):
        for v, run in sorted({(r["variant"], r.get("run", "")) for r in rows}):
            mine = [r for r in rows if r["variant"] == v and r.get("run", "") == run]
            xs, ys = [r["rows"] / 1e6 for r in mine], [r[key] for r in mine]
            ax.plot(xs, ys, "o-" if v == "v4" else "s--", label=f"{v} ({run})" if run else v)
        ax.set_xlabel("rows in the log (millions)")
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle("request log: random (v4) against time-ordered (v7) ids, default buffers")
    fig.tight_layout()
    fig.savefig(out / "id-order.png", dpi=90)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=3_000_000, help="each variant")
    ap.add_argument("--step", type=int, default=250_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=3, help="writers (the persister's pool)")
    ap.add_argument("--variants", default="v4,v7")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--plot", type=Path, help="draw a result file into --out; run nothing")
    args = ap.parse_args(argv)
    if args.plot:
        plot(args.plot, args.out or args.plot.parent)
        return 0
    out: dict[str, Any] = {"machine": machine(), "args": vars(args) | {"out": None}, "rows": []}
    for v in args.variants.split(","):
        out["rows"] += run_variant(v, args)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "id-order.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
