"""How a vector's width and the column's storage settings shape the result write.

A PostgreSQL row over about 2 KB (TOAST_TUPLE_THRESHOLD, 2,032 bytes) is handed to
TOAST: with the column's default storage (EXTENDED) each wide value is first tried with
compression (float32 data from a model does not compress), then moved out of line into
the partition's TOAST table, one more heap insert and one more index insert per row.
A 384-wide float32 vector (1,536 bytes) stays under the threshold; 768, 1,024 and 1,536
wide ones (3 to 6 KB) do not.

A fresh PostgreSQL (durable settings, the schema at head, one daily partition of the
log). For every width and every storage setting, ``--runs`` runs of ``--batches``
batches of 256 embedding rows written by the scheduler's own statement
(results/store.py ``persist``, one writer), each row a distinct unit-norm float32
vector from a normal distribution (what an embedding model returns). Per run: rows/s,
the server's CPU per row (every postgres process, read from /proc), WAL bytes per row,
and then heap, TOAST and index bytes per row of the partition. The partition is
emptied (TRUNCATE) and checkpointed before every run.

Settings compared (``--settings``):
* ``extended``  the default: compress, then move out of line;
* ``lz4``       EXTENDED with the column's compression lz4 (pglz is the default);
* ``external``  ``SET STORAGE EXTERNAL``: out of line, no compression attempt;
* ``inline``    EXTERNAL and the partition's ``toast_tuple_target`` at its maximum
  (8,160): a row that fits in a page stays in the heap (the schema's since
  migration 0019).

Each run sets the column's storage and the partition's parameter itself, whatever the
schema's are.

    flock /tmp/gristmill-heavy.lock .venv/bin/python -m bench.store.vector_widths \\
        --out docs/bench/store        # ~6 min here
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from bench.peers.procs import cpu_seconds
from bench.store.batch_rows import batch_rows
from bench.store.persist import machine
from core.config import settings_from_env
from gristmill.devservices import PostgresServer
from gristmill.migrate import migrate_database
from results.db import make_engine
from results.partitions import REQUESTS_TOAST_TUPLE_TARGET
from results.partitions import create as create_partition
from results.retention import Slot, partition_name
from results.store import persist

BATCH = 256
WIDTHS = (384, 768, 1024, 1536)
SETTINGS = ("extended", "lz4", "external", "inline")
# The defaults' 128 MB of buffers would make the larger widths' runs measure eviction.
PG_SETTINGS = {"shared_buffers": "1GB", "max_wal_size": "4GB", "checkpoint_timeout": "15min"}


def vectors(n: int, dim: int, seed: int) -> list[bytes]:
    """``n`` distinct unit-norm float32 vectors, as results/vectors.py stores them."""
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((n, dim), dtype=np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return [row.tobytes() for row in v]


class WidthBench:
    def __init__(self, workdir: Path):
        self.pg = PostgresServer(workdir, fast=False)
        self.partition = ""
        self.tenant = ""

    def start(self) -> None:
        self.pg.start()
        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            for k, v in PG_SETTINGS.items():
                conn.execute(f"ALTER SYSTEM SET {k} = '{v}'")
        self.pg.restart()
        settings = settings_from_env(
            {"DATABASE_URL": self.pg.url, "GRISTMILL_ALLOW_WEAK_DURABILITY": "true"}
        )
        migrate_database(settings)
        self.engine = make_engine(settings.database_url, pool_size=2)
        day = timedelta(days=1)
        lo = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            for (name,) in conn.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'requests'"
            ).fetchall():
                conn.execute(f"DROP TABLE {name}")
            row = conn.execute(
                "INSERT INTO tenants (name, tier) VALUES ('bench', 'paid') RETURNING id"
            ).fetchone()
            assert row is not None
            self.tenant = str(row[0])
            conn.execute(
                "INSERT INTO models (name, version, max_batch_size) "
                "VALUES ('all-minilm-l6-v2', '1', 256)"
            )
            self.lz4 = True
            try:
                conn.execute("SET default_toast_compression = lz4")
            except psycopg.Error:
                self.lz4 = False
        self.partition = partition_name("requests", lo, day)
        create_partition(self.engine, Slot("requests", self.partition, lo, lo + day), "received_at")
        self.at = lo + timedelta(hours=1)

    def stop(self) -> None:
        if hasattr(self, "engine"):
            self.engine.dispose()
        self.pg.stop()
        shutil.rmtree(self.pg.workdir, ignore_errors=True)

    def configure(self, setting: str) -> None:
        p = self.partition
        storage = "EXTENDED" if setting in ("extended", "lz4") else "EXTERNAL"
        compression = "lz4" if setting == "lz4" else "pglz"
        target = REQUESTS_TOAST_TUPLE_TARGET if setting == "inline" else 2032
        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE requests ALTER COLUMN output_vector SET STORAGE {storage}")
            conn.execute(
                f"ALTER TABLE requests ALTER COLUMN output_vector SET COMPRESSION {compression}"
            )
            conn.execute(f"ALTER TABLE {p} SET (toast_tuple_target = {target})")
            conn.execute(f"TRUNCATE {p}")
            conn.execute("CHECKPOINT")

    def run(self, dim: int, batches: int, seed: int) -> dict[str, Any]:
        vecs = vectors(batches * BATCH, dim, seed)
        work = [
            batch_rows(vecs[k * BATCH : (k + 1) * BATCH], self.tenant, self.at)
            for k in range(batches)
        ]
        self.at += timedelta(seconds=1)
        persist(self.engine, batch_rows(vectors(1, dim, seed + 1), self.tenant, self.at), None)
        pid = self.pg.pid
        assert pid is not None
        with psycopg.connect(self.pg.dsn, autocommit=True) as conn:
            lsn0 = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
            cpu0 = cpu_seconds(pid)
            t0 = time.perf_counter()
            for rows in work:
                persist(self.engine, rows, None)
            dt = time.perf_counter() - t0
            cpu = cpu_seconds(pid) - cpu0
            assert lsn0 is not None
            wal = conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn0[0],)
            ).fetchone()
            assert wal is not None
            conn.execute(f"VACUUM {self.partition}")  # sizes with the visibility map built
            sizes = conn.execute(
                "SELECT pg_relation_size(c.oid), "
                "coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0), "
                "pg_indexes_size(c.oid), (SELECT count(*) FROM " + self.partition + ") "
                "FROM pg_class c WHERE c.relname = %s",
                (self.partition,),
            ).fetchone()
            assert sizes is not None
        n = batches * BATCH
        heap, toast, index, stored = sizes
        return {
            "rows_per_s": n / dt,
            "server_cpu_us_per_row": 1e6 * cpu / n,
            "wal_bytes_per_row": float(wal[0]) / n,
            "heap_bytes_per_row": heap / stored,
            "toast_bytes_per_row": toast / stored,
            "index_bytes_per_row": index / stored,
        }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in runs[0]:
        vals = [r[k] for r in runs]
        out[k] = round(statistics.median(vals), 1)
        if k in ("rows_per_s", "server_cpu_us_per_row"):
            out[k + "_range"] = [round(min(vals), 1), round(max(vals), 1)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--batches", type=int, default=160, help="batches of 256 rows a run")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None, help="folder for vector_widths.json")
    args = ap.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    settings = args.settings.split(",")
    workdir = Path(tempfile.mkdtemp(prefix="gm-widths-"))
    workdir.chmod(0o711)  # PostgreSQL runs as a user of its own
    bench = WidthBench(workdir)
    results: list[dict[str, Any]] = []
    try:
        bench.start()
        if not bench.lz4 and "lz4" in settings:
            print("this PostgreSQL is built without lz4: skipping that setting")
            settings.remove("lz4")
        seed = 0
        for dim in widths:
            # Runs interleaved across settings, so a neighbour's load on the shared
            # machine falls on all of them alike.
            per: dict[str, list[dict[str, Any]]] = {s: [] for s in settings}
            for _ in range(args.runs):
                for s in settings:
                    bench.configure(s)
                    seed += 2
                    per[s].append(bench.run(dim, args.batches, seed))
            for s in settings:
                r = {"width": dim, "setting": s, **summarise(per[s])}
                results.append(r)
                print(json.dumps(r), flush=True)
    finally:
        bench.stop()
    doc = {
        "machine": machine(),
        "batch": BATCH,
        "batches_per_run": args.batches,
        "runs": args.runs,
        "pg_settings": PG_SETTINGS,
        "results": results,
    }
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "vector_widths.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
