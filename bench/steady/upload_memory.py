"""An API process's memory across job uploads (issue 30: memory flat for hours).

    python -m bench.steady.upload_memory --items 60000 --uploads 12

One system (Kafka, PostgreSQL, no scheduler: the items wait in Kafka), and for each
``--settings`` entry in turn a fresh API process of one uvicorn process given that
environment ("default": what ingest/main.py sets; a number: ``MALLOC_ARENA_MAX``;
``NAME=VALUE`` pairs joined by ``+``: glibc's other tunables), which receives
``--uploads`` JSONL jobs of ``--items`` items one after another. After each upload, and
a pause long enough for the publish to finish and its memory to be trimmed, the
process's private memory (USS) is read. Writes ``upload-memory.json`` and ``.png`` under
``--out``: one line per setting, MiB against uploads.
"""

from __future__ import annotations

import argparse
import json
import re
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


def setting_env(setting: str) -> dict[str, str]:
    """``--settings``' one entry as the API process's environment."""
    if setting == "default":
        return {}
    if setting.isdigit():
        return {"MALLOC_ARENA_MAX": setting}
    return dict(pair.split("=", 1) for pair in setting.split("+"))


def one_setting(system: System, setting: str, body: bytes, uploads: int, settle_s: float) -> dict:
    env = setting_env(setting)
    name = f"api-{len(system.procs)}"
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
        "setting": setting,
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
        setting = run.get("setting", run.get("arenas"))  # r1's runs say "arenas"
        label = setting if not str(setting).isdigit() else f"MALLOC_ARENA_MAX={setting}"
        label = re.sub(r"/\S*/(lib\w+\.so[.\d]*)", r"\1", label)  # a preload by its name
        ax.plot(range(len(run["uss_mib"])), run["uss_mib"], marker="o", label=label)
    ax.set_xlabel("job uploads received")
    ax.set_ylabel("API process private memory (MiB)")
    ax.set_title(f"One API process, {report['items']:,}-item JSONL uploads")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=60_000)
    ap.add_argument("--uploads", type=int, default=12)
    ap.add_argument(
        "--settings",
        default="default,16",
        help="comma-separated: default, an arena count, or NAME=VALUE[+NAME=VALUE]",
    )
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
                for a in args.settings.split(",")
            ]
        finally:
            system.close()
    report = {"items": args.items, "uploads": args.uploads, "runs": runs}
    (args.out / "upload-memory.json").write_text(json.dumps(report, indent=1))
    chart(report, args.out / "upload-memory.png")
    for run in runs:
        print(
            f"{run['setting']}: {run['uss_mib'][1]} -> {run['uss_mib'][-1]} MiB "
            f"after the first upload ({run['growth_after_first']:+.1%})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
