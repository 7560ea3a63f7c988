"""How long the publisher's read-back of a job's unsent items takes on a fresh database
(the path of a job another API instance finishes, and of ``/retry``), before and after
PostgreSQL has analysed ``job_items``.

    python -m bench.job_readback --items 300000

Starts its own Kafka and PostgreSQL and one API (no scheduler: every item stays unsent),
uploads ``--items`` lines with ``bench.job_upload``'s helpers, prints the plan of one page
query, reads every page back (``results.job_items.unsent_page``, as
``JobPublisher._unsent_pages`` walks it), runs ``ANALYZE job_items`` and reads again.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from sqlalchemy import Engine, text

from bench.job_upload import upload, write_jsonl
from gristmill.devservices.stack import build_system, local_services
from results.db import make_engine
from results.job_items import unsent_page

WIDTH = 5_000


def read_back(engine: Engine, job_id: str, items: int) -> tuple[int, float]:
    started, after, n = time.perf_counter(), -1, 0
    while after < items - 1:
        n += len(unsent_page(engine, job_id, after, WIDTH))
        after += WIDTH
    return n, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=300_000)
    a = ap.parse_args(argv)
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gm-readback-")))
        system = build_system(stack.enter_context(local_services(work)), work)
        stack.callback(system.close)
        url = system.start_api("api")
        write_jsonl(work / "items.jsonl", a.items, 240)
        print("upload:", upload(url, system.keys["enterprise"], work / "items.jsonl", a.items))
        engine = make_engine(system.settings.database_url)
        with engine.connect() as conn:
            job_id = str(conn.execute(text("SELECT job_id FROM jobs")).scalar())
        page = text(
            "EXPLAIN SELECT i.item_index FROM job_items i WHERE i.job_id = :j "
            "AND i.item_index > 1000 AND i.item_index <= :last AND NOT EXISTS "
            "(SELECT 1 FROM requests r WHERE r.request_id = i.request_id) ORDER BY i.item_index"
        )
        for label in ("fresh database", "after ANALYZE job_items"):
            with engine.connect() as conn:
                plan = conn.execute(page, {"j": job_id, "last": 1000 + WIDTH}).scalars()
                print("\n".join(plan))
            n, seconds = read_back(engine, job_id, a.items)
            print(f"{label}: {n} unsent items read back in {seconds:.1f} s")
            with engine.begin() as conn:
                conn.execute(text("ANALYZE job_items"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
