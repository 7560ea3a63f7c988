"""An incremental job against a full one (decision 61): a corpus embedded once, then
re-submitted with a share of its items changed.

    python -m bench.jobs_incremental --items 200000 --changed 0.05 --runs 3

Starts its own system on loopback (Kafka, PostgreSQL, API, a scheduler with 2 `sim`
workers at 100 ms per batch of up to 100: 2,000 items/s), `sim` answering float32
vectors of --dim (384: all-MiniLM-L6-v2's size, so what the store copies is an
embedding's size). Submits the corpus once as the base, then, --runs times and in
alternating order, the changed corpus as a full job (the baseline, rerun in the same
run) and as an incremental job naming the base. Each time is from the first byte of the
upload to the job seen finished (polled every 0.2 s). Every pair's outputs are compared
item by item in PostgreSQL (the stored float32 bytes, by index), and the incremental
job's reused items counted. Prints and writes JSON under bench-out/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson
from gristmill_client import Client
from sqlalchemy import text

from bench.system import sim_system
from gristmill.devservices.stack import System
from results.db import make_engine

POLL_S = 0.2


def changed(i: int, share: float) -> bool:
    """Spread evenly: every (1/share)-th item changes."""
    return share > 0 and i % round(1 / share) == 0


def write_corpus(path: Path, n: int, tag: str, share: float, version: str) -> None:
    """A sentence-sized text an item (about 80 characters); the changed ones carry
    ``version`` instead of v1."""
    with path.open("wb") as f:
        for start in range(0, n, 10_000):
            f.write(
                b"".join(
                    orjson.dumps(
                        {
                            "custom_id": f"doc-{i}",
                            "input": f"{tag} document {i} of the corpus, revision "
                            f"{version if changed(i, share) else 'v1'}, some words",
                        }
                    )
                    + b"\n"
                    for i in range(start, min(n, start + 10_000))
                )
            )


def timed_job(gm: Client, src: Path, base_job_id: str | None = None) -> dict[str, Any]:
    t0 = time.monotonic()
    job = gm.submit_job("sim", src, base_job_id=base_job_id)
    accepted = time.monotonic() - t0
    done = gm.wait(job["job_id"], poll_s=POLL_S)
    return {
        "job_id": job["job_id"],
        "accepted_s": round(accepted, 2),
        "end_to_end_s": round(time.monotonic() - t0, 2),
        "status": done["status"],
        "counts": done["counts"],
        "usage": done["usage"],
    }


def compare(system: System, job_a: str, job_b: str) -> dict[str, int]:
    """Items whose stored outputs differ between the two jobs (by index), and items
    either job lacks a succeeded result for."""
    with make_engine(system.settings.database_url).begin() as conn:
        # Both jobs are fresh: the planner's statistics know neither (results/job_reuse.py).
        conn.execute(text("SET LOCAL enable_nestloop = off"))
        row = conn.execute(
            text(
                "SELECT count(*) FILTER (WHERE a.output_vector IS DISTINCT FROM b.output_vector "
                "   OR a.output IS DISTINCT FROM b.output), "
                " count(*) FILTER (WHERE a.status IS DISTINCT FROM 'succeeded' "
                "   OR b.status IS DISTINCT FROM 'succeeded'), count(*) "
                "FROM job_items ia JOIN job_items ib ON ib.job_id = :b "
                "  AND ib.item_index = ia.item_index "
                "LEFT JOIN requests a ON a.job_id = :a AND a.request_id = ia.request_id "
                "LEFT JOIN requests b ON b.job_id = :b AND b.request_id = ib.request_id "
                "WHERE ia.job_id = :a"
            ),
            {"a": job_a, "b": job_b},
        ).one()
    return {"differing": int(row[0]), "unanswered": int(row[1]), "compared": int(row[2])}


def summary(xs: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(xs), 2),
        "min": round(min(xs), 2),
        "max": round(max(xs), 2),
    }


def run(system: System, n: int, share: float, runs: int, work: Path) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    v1, v2 = work / "v1.jsonl", work / "v2.jsonl"
    write_corpus(v1, n, tag, share, "v1")
    write_corpus(v2, n, tag, share, "v2")
    gm = Client(system.url, system.keys["enterprise"], timeout_s=3600)
    base = timed_job(gm, v1)
    print("base", json.dumps(base))
    pairs = []
    for r in range(runs):
        order = ["full", "incremental"] if r % 2 == 0 else ["incremental", "full"]
        pair: dict[str, Any] = {}
        for kind in order:
            pair[kind] = timed_job(gm, v2, base["job_id"] if kind == "incremental" else None)
            print(kind, json.dumps(pair[kind]))
        pair["check"] = compare(system, pair["incremental"]["job_id"], pair["full"]["job_id"])
        print("check", json.dumps(pair["check"]))
        pairs.append(pair)
    full = [p["full"]["end_to_end_s"] for p in pairs]
    inc = [p["incremental"]["end_to_end_s"] for p in pairs]
    return {
        "items": n,
        "changed_share": share,
        "expected_reused": sum(1 for i in range(n) if not changed(i, share)),
        "base": base,
        "runs": pairs,
        "full_s": summary(full),
        "incremental_s": summary(inc),
        "ratio_of_medians": round(statistics.median(inc) / statistics.median(full), 4),
        "all_outputs_equal": all(
            p["check"]["differing"] == 0
            and p["check"]["unanswered"] == 0
            and p["check"]["compared"] == n
            for p in pairs
        ),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--items", type=int, default=200_000)
    ap.add_argument("--changed", type=float, default=0.05, help="share of items changed")
    ap.add_argument("--runs", type=int, default=3, help="pairs of (full, incremental) jobs")
    ap.add_argument("--dim", type=int, default=384, help="length of sim's vectors")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        system = sim_system(
            stack, "gm-incremental-", extra_env={"GRISTMILL_SIM_VECTOR_DIM": str(args.dim)}
        )
        report = run(system, args.items, args.changed, args.runs, system.workdir)
    report["dim"] = args.dim
    print(json.dumps({k: v for k, v in report.items() if k not in ("runs", "base")}, indent=2))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"jobs-incremental-{stamp}.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
