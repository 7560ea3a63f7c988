"""What starting a re-embed costs (decision 68): ``results/reembed.py`` ``promote`` on a
corpus job of N items - the gate, the promote, the items copied, each item's content hash
for the new version, the job and migration rows - in one transaction, against a real
PostgreSQL. Kafka is not in it (the produce after the commit is a job's publish, measured
by the job benchmarks). Each run is rolled back, so every run starts from the same state.

    python -m bench.reembed_start --items 10000 100000 --runs 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import text

from core.config import settings_from_env
from core.models.reembed import corpus_of
from core.models.registry import VersionState, new_record, with_state
from gristmill.devservices.postgres import PostgresServer
from gristmill.migrate import migrate_database
from ingest.jobs.incremental import reembed_maker
from results import modelregistry, reembed
from results.db import make_engine
from results.tenants import create_tenant

_CORPUS = text("""
    INSERT INTO job_items (job_id, item_index, custom_id, input, request_id)
    SELECT :job, i, 'c' || i, to_jsonb('document number ' || i || ' of the corpus'),
           gen_random_uuid()
    FROM generate_series(0, :n - 1) AS i""")
_JOB = text("""
    INSERT INTO jobs (job_id, tenant_id, model, model_version, total_items, expires_at,
                      submit_state, finished_at)
    VALUES (:job, :tenant, :model, '1', :n, now() + interval '1 day', 'submitted', now())""")


def run(database_url: str, sizes: list[int], runs: int) -> dict[str, object]:
    settings = settings_from_env({"DATABASE_URL": database_url})
    migrate_database(settings)
    engine = make_engine(database_url)
    name = f"bench-{uuid.uuid4().hex[:6]}"
    with engine.begin() as conn:
        tenant = create_tenant(conn, f"t-{name}", "paid")
        for v, state in (("1", VersionState.LIVE), ("2", VersionState.STAGED)):
            cfg = {"vector_dim": 384, "variant": v}
            record = new_record(
                f"{name}@{v}", backend="sim", max_batch_size=64, config=cfg, settings=settings
            )
            modelregistry.register(conn, with_state(record, state), "bench")
        rid = modelregistry.start_replay(
            conn, name, "2", "bench", datetime.now(UTC) - timedelta(hours=1)
        )
        modelregistry.finish_replay(conn, rid, 1, True, {})
    sized: dict[str, object] = {}
    for n in sizes:
        job = str(uuid.uuid4())
        with engine.begin() as conn:
            conn.execute(_CORPUS, {"job": job, "n": n})
            conn.execute(_JOB, {"job": job, "tenant": tenant.id, "model": name, "n": n})
            conn.execute(text("ANALYZE job_items"))
        times = []
        for _ in range(runs):
            corpus = corpus_of(tenant.name, job_id=job, now=datetime.now(UTC))
            maker = reembed_maker(settings, name, "2")
            with engine.connect() as conn:
                t0 = time.perf_counter()
                with conn.begin() as tx:
                    _, m = reembed.promote(conn, name, "2", "bench", corpus, maker)
                    assert m.total == n
                    elapsed = time.perf_counter() - t0
                    tx.rollback()
            times.append(elapsed)
        med = statistics.median(times)
        sized[str(n)] = {
            "seconds": [round(t, 3) for t in times],
            "median_s": round(med, 3),
            "items_per_s": round(n / med),
        }
        print(f"{n:>9} items: median {med:.2f} s ({n / med:,.0f} items/s), runs {times}")
    engine.dispose()
    return {"runs": runs, "sizes": sized}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    pg_dir = Path(tempfile.mkdtemp(prefix="gristmill-pg-"))
    pg_dir.chmod(0o711)
    pg = PostgresServer(pg_dir, fast=True)
    pg.start()
    try:
        result = run(pg.url, a.items, a.runs)
    finally:
        pg.stop()
        shutil.rmtree(pg_dir, ignore_errors=True)
    if a.out:
        a.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
