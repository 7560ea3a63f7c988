"""How fast a large JSONL job upload is accepted (issue 33: 25,000 items/s or better).

    python -m bench.job_upload --items 1000000 --runs 3
    python -m bench.job_upload --baseline-tree /tmp/gm-base   # the same, interleaved with
                                                              # an API run from another checkout

Starts its own Kafka and PostgreSQL (or KAFKA_BOOTSTRAP / DATABASE_URL), one API process
(and with ``--scheduler`` a scheduler with 2 `sim` workers that runs the items meanwhile),
writes a JSONL file of ``--items`` lines of about ``--line-bytes`` bytes, and uploads it
``--runs`` times as ``POST /v1/jobs`` (application/x-ndjson, 1 MiB chunks), timing each
from the first byte sent to the 202. The API's ``gristmill_job_submit_seconds`` gives each
run's phases: stage (read, validate, write the temp file), record (the COPY, the budget
and the job row) and publish (every item into Kafka). With ``--baseline-tree`` each run
is done against both APIs in turn, on the same services, so both see the same machine.
With ``--publish-compare`` the two APIs are this checkout's with its jobs published in a
child process (decision 74) and in threads of the API process itself
(``GRISTMILL_JOB_PUBLISH_PROCESS=false``); with ``--beside-rps R`` each upload has sync
``/v1/infer`` requests at R a second going to the same API process (open loop, from a
process of their own), for ``--lead-s`` seconds alone before it and through it, and the
report gives their latency alone and while the upload ran:

    python -m bench.job_upload --items 200000 --runs 3 --publish-compare --beside-rps 100

Writes JSON under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from bench.openloop import percentile, run_in_child, run_open_loop
from gristmill.devservices.stack import System, build_system, local_services

CHUNK = 1 << 20
PHASES = ("stage", "record", "publish")


def write_jsonl(path: Path, n: int, line_bytes: int) -> int:
    """``n`` items of about ``line_bytes`` bytes each (a custom id and a text input)."""
    pad = "w" * max(1, line_bytes - 50)
    with path.open("wb") as f:
        for start in range(0, n, 10_000):
            f.write(
                b"".join(
                    orjson.dumps({"custom_id": f"row-{i}", "input": f"{i} {pad}"}) + b"\n"
                    for i in range(start, min(n, start + 10_000))
                )
            )
    return path.stat().st_size


def phase_sums(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    out = dict.fromkeys(PHASES, 0.0)
    for fam in text_string_to_metric_families(text):
        if fam.name == "gristmill_job_submit_seconds":
            for s in fam.samples:
                if s.name.endswith("_sum"):
                    out[s.labels["phase"]] = s.value
    return out


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            yield block


def upload(url: str, key: str, path: Path, n: int) -> dict[str, Any]:
    before = phase_sums(url)
    t0 = time.perf_counter()
    r = httpx.post(
        f"{url}/v1/jobs",
        params={"model": "sim"},
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/x-ndjson"},
        content=_chunks(path),
        timeout=3600,
    )
    seconds = time.perf_counter() - t0
    if r.status_code != 202:
        raise RuntimeError(f"upload answered {r.status_code}: {r.text[:300]}")
    after = phase_sums(url)
    return {
        "seconds": round(seconds, 2),
        "items_per_s": round(n / seconds),
        "phases_s": {p: round(after[p] - before[p], 2) for p in PHASES},
    }


def _beside(url: str, key: str, rate: float, seconds: float) -> dict[str, Any]:
    """Sync requests at ``rate`` for ``seconds`` (in a child process): when the load
    began (epoch s) and each request's (intended start s, latency ms, status)."""

    async def load() -> dict[str, Any]:
        began = time.time()
        res = await run_open_loop(
            url=f"{url}/v1/infer",
            headers={"Authorization": f"Bearer {key}"},
            rate=rate,
            count=int(rate * seconds),
            make_body=lambda i: {"model": "sim", "input": f"beside {i}"},
        )
        return {
            "began": began,
            "samples": [(x.intended, x.latency_ms, x.status) for x in res.samples],
        }

    return run_in_child(load())


def _window(samples: list[tuple[float, float, int]], lo: float, hi: float) -> dict[str, Any]:
    inside = [(lat, st) for t, lat, st in samples if lo <= t < hi]
    ok = [lat for lat, st in inside if st == 200]
    return {
        "requests": len(inside),
        "not_200": len(inside) - len(ok),
        **{f"p{q}_ms": round(percentile(ok, q), 1) for q in (50, 95, 99)},
    }


def upload_beside(
    url: str, key: str, path: Path, n: int, rate: float, lead_s: float, expect_s: float
) -> dict[str, Any]:
    """An upload with sync requests beside it: their latency alone (the ``lead_s`` before
    the upload) and while the upload ran (from its first byte to its 202)."""
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx) as pool:
        load = pool.submit(_beside, url, key, rate, lead_s + 1.5 * expect_s + 2)
        time.sleep(lead_s)
        began = time.time()
        r = upload(url, key, path, n)
        ended = time.time()
        got = load.result()
    lead_from = got["began"]
    r["sync_alone"] = _window(got["samples"], 1.0, began - lead_from)  # past the first second
    r["sync_beside"] = _window(got["samples"], began - lead_from, ended - lead_from)
    return r


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rates = sorted(r["items_per_s"] for r in runs)
    sync = {
        f"{w}_{k}_median": round(statistics.median(r[w][k] for r in runs), 1)
        for w in ("sync_alone", "sync_beside")
        for k in ("p50_ms", "p95_ms", "not_200")
        if all(w in r for r in runs)
    }
    return {
        **sync,
        "runs": runs,
        "items_per_s_median": round(statistics.median(rates)),
        "items_per_s_min": rates[0],
        "items_per_s_max": rates[-1],
        "phases_s_median": {
            p: round(statistics.median(r["phases_s"][p] for r in runs), 2) for p in PHASES
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--line-bytes", type=int, default=240)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--scheduler", action="store_true", help="run the items meanwhile")
    ap.add_argument("--baseline-tree", type=Path, help="a checkout whose API is the baseline")
    ap.add_argument(
        "--publish-compare", action="store_true", help="publishing in a child against threads"
    )
    ap.add_argument("--beside-rps", type=float, default=0.0, help="sync requests beside each")
    ap.add_argument("--lead-s", type=float, default=5.0, help="of sync alone before each upload")
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    a = ap.parse_args(argv)
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gm-upload-")))
        services = stack.enter_context(local_services(work))
        system: System = build_system(
            services, work, extra_env={"GRISTMILL_MAX_JOB_ITEMS": str(max(a.items, 1_000_000))}
        )
        stack.callback(system.close)
        if a.scheduler or a.beside_rps:
            system.start_scheduler(workers=2, models="sim")
        if a.publish_compare:
            apis = {
                "processes": system.start_api("api", env={"GRISTMILL_JOB_PUBLISH_PROCESS": "true"}),
                "threads": system.start_api(
                    "api-threads", env={"GRISTMILL_JOB_PUBLISH_PROCESS": "false"}
                ),
            }
        else:
            apis = {"new": system.start_api("api")}
        if a.baseline_tree:
            base = str(a.baseline_tree.resolve())
            apis["baseline"] = system.start_api(
                "api-baseline", env={"PYTHONPATH": base}, cwd=a.baseline_tree
            )
        src = work / "items.jsonl"
        size = write_jsonl(src, a.items, a.line_bytes)
        print(f"{a.items} items, {size / 1e6:.0f} MB ({size / a.items:.0f} bytes a line)")
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in apis}
        key = system.keys["enterprise"]
        expect_s = 0.0
        if a.beside_rps:  # the load's length: an upload's time, unloaded, once
            system.url = next(iter(apis.values()))
            system.wait_until_serving("sim")
            expect_s = max(upload(url, key, src, a.items)["seconds"] for url in apis.values())
        for run in range(a.runs):
            for name, url in apis.items():
                if a.beside_rps:
                    r = upload_beside(url, key, src, a.items, a.beside_rps, a.lead_s, expect_s)
                else:
                    r = upload(url, key, src, a.items)
                results[name].append(r)
                print(f"run {run + 1} {name}: {r}", flush=True)
        report = {
            "items": a.items,
            "bytes": size,
            "scheduler": a.scheduler or bool(a.beside_rps),
            "beside_rps": a.beside_rps,
            "cpus": os.cpu_count(),
            **{name: summary(runs) for name, runs in results.items()},
        }
    print(json.dumps({k: v for k, v in report.items()}, indent=1))
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "job_upload.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
