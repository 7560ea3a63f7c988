"""An API process's memory across job uploads (issue 30: memory flat for hours).

    python -m bench.steady.upload_memory --items 60000 --uploads 12

One system (Kafka, PostgreSQL, no scheduler: the items wait in Kafka), and for each
``--arenas`` setting in turn a fresh API process of one uvicorn process given that
``MALLOC_ARENA_MAX`` ("default": what ingest/main.py sets, two), which receives
``--uploads`` JSONL jobs of ``--items`` items one after another. After each upload, and
a pause long enough for the publish to finish and its memory to be trimmed, the
process's private memory (USS) is read. Writes ``upload-memory.json`` and ``.png`` under
``--out``: one line per setting, MiB against uploads.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

from gristmill.devservices.stack import System, build_system, local_services


def _body(items: int) -> bytes:
    return b"".join(orjson.dumps({"input": f"item-{i}"}) + b"\n" for i in range(items))


def one_setting(system: System, arenas: str, body: bytes, uploads: int, settle_s: float) -> dict:
    env = {} if arenas == "default" else {"MALLOC_ARENA_MAX": arenas}
    name = f"api-arenas-{arenas}"
    url = system.start_api(name=name, env=env)
    proc = psutil.Process(system.procs[name].pid)
    headers = {**system.headers("paid"), "Content-Type": "application/x-ndjson"}
    uss = [proc.memory_full_info().uss / 2**20]
    try:
        for _ in range(uploads):
            r = httpx.post(f"{url}/v1/jobs?model=sim", content=body, headers=headers, timeout=300)
            r.raise_for_status()
            time.sleep(settle_s)
            uss.append(round(proc.memory_full_info().uss / 2**20, 1))
    finally:
        system.stop(name)
    first = uss[1]  # after the first upload: its imports and pools are warm
    return {
        "arenas": arenas,
        "uss_mib": uss,
        "growth_after_first_mib": round(uss[-1] - first, 1),
        "growth_after_first": round((uss[-1] - first) / first, 4),
    }


def chart(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for run in report["runs"]:
        label = f"MALLOC_ARENA_MAX={run['arenas']}"
        ax.plot(range(len(run["uss_mib"])), run["uss_mib"], marker="o", label=label)
    ax.set_xlabel("job uploads received")
    ax.set_ylabel("API process private memory (MiB)")
    ax.set_title(f"One API process, {report['items']:,}-item JSONL uploads")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=60_000)
    ap.add_argument("--uploads", type=int, default=12)
    ap.add_argument("--arenas", default="default,16", help="settings to compare, in order")
    ap.add_argument("--settle-s", type=float, default=3.0)
    ap.add_argument("--out", type=Path, default=Path("upload-memory"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    body = _body(args.items)
    work = Path(tempfile.mkdtemp(prefix="gristmill-upmem-"))
    with local_services(work, external=False) as services:
        system = build_system(services, work)
        try:
            runs = [
                one_setting(system, a, body, args.uploads, args.settle_s)
                for a in args.arenas.split(",")
            ]
        finally:
            system.close()
    report = {"items": args.items, "uploads": args.uploads, "runs": runs}
    (args.out / "upload-memory.json").write_text(json.dumps(report, indent=1))
    chart(report, args.out / "upload-memory.png")
    for run in runs:
        print(
            f"arenas {run['arenas']}: {run['uss_mib'][1]} -> {run['uss_mib'][-1]} MiB "
            f"after the first upload ({run['growth_after_first']:+.1%})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
