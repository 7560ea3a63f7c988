"""Two tenants of equal weight, 8-token and 256-token inputs, both backlogged: does each
get half of the device? (issue 32 item 3, decision 65)

    python -m bench.fairness_device --runs 3 --window 30

1. Calibration, in this process, on the idle model: device ms an item costs at each
   length (the fastest of repeats, the lengths in turn, as the run's batches hold them:
   about 32 short items and one long one). This is the measure
   of received device time that does not come from the scheduler's own estimates.
2. For each mode (``requests``: the fair queue counts requests, as before decision 65;
   ``device_time``: it charges each item its estimated device time), a system of its
   own (Kafka, PostgreSQL, API, one scheduler, one CPU worker of all-minilm-l6-v2)
   with two paid tenants of weight 1. Each keeps ``--short-loops`` / ``--long-loops``
   closed-loop clients sending ``/v1/embeddings`` requests of ``--short-inputs`` /
   ``--long-inputs`` texts (a deadline of two minutes: nothing expires), so both always
   have inputs queued. After ``--warm`` seconds, ``--runs`` windows of ``--window`` s.
2. Then, in the same system, each tenant alone for ``--solo`` s: its batches hold one
   length only, so their measured compute / size is what an item of that length costs
   on this host under this load (the median batch). This is the measure of received
   device time that does not come from the scheduler's own estimates (an in-process
   calibration on this shared 2-core host moved the 256:8 cost ratio from 34 to 22
   with what else ran).
3. Per window and tenant, from the request log: inputs computed, their device time at
   the solo cost (independent), and the ledger's device time (``batches.shares``, the
   scheduler's split of measured batch times). The share of the short tenant and the
   short/long ratio per window; medians over the windows.

Writes JSON and a PNG under ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from bench.embedding import MODEL
from bench.fairness import paid_tenant
from gristmill.devservices.stack import System, build_system, local_services
from results.db import make_engine

LENGTHS = {"short": 8, "long": 256}
MODES = ("requests", "device_time")


def texts(length: int, n: int, seed: int) -> list[str]:
    from core.models.text_tokenizer import shared_tokenizer
    from workers.models.embedding.warmup import synthetic_texts

    tok = shared_tokenizer(None, 256)
    assert tok is not None
    return synthetic_texts(tok, n, length, length, seed=seed)


def solo_cost_ms(system: System, t0: float, t1: float) -> float:
    """Median measured compute an item of the batches formed in [t0, t1) (one length)."""
    with make_engine(system.settings.database_url).connect() as conn:
        per_item = conn.execute(
            text(
                "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY compute_ms / size)"
                " FROM batches WHERE formed_at >= to_timestamp(:a)"
                " AND formed_at < to_timestamp(:b) AND compute_ms IS NOT NULL"
            ),
            {"a": t0, "b": t1},
        ).scalar_one()
    return float(per_item)


async def closed_loop(
    url: str, key: str, inputs: list[str], per_request: int, loops: int, until: float
) -> Counter[int]:
    """``loops`` clients, each sending its next request when the last is answered;
    the answers' statuses counted (a refused request does not keep a tenant backlogged)."""
    codes: Counter[int] = Counter()

    async def one(k: int) -> None:
        async with httpx.AsyncClient(timeout=180) as client:
            i = k
            while time.time() < until:
                chunk = [inputs[(i + j) % len(inputs)] for j in range(per_request)]
                i += per_request * loops
                r = await client.post(
                    f"{url}/v1/embeddings",
                    headers={"Authorization": f"Bearer {key}"},
                    json={"model": MODEL, "input": chunk, "timeout_ms": 120_000},
                )
                codes[r.status_code] += 1
                if r.status_code != 200:
                    await asyncio.sleep(float(r.headers.get("retry-after", 0.1)))

    await asyncio.gather(*(one(k) for k in range(loops)))
    return codes


def window_counts(system: System, ids: dict[str, str], t0: float, t1: float) -> dict[str, Any]:
    """Inputs computed per tenant in [t0, t1) and the ledger's seconds for them."""
    out: dict[str, Any] = {}
    with make_engine(system.settings.database_url).connect() as conn:
        for name, tid in ids.items():
            n = conn.execute(
                text(
                    "SELECT count(*) FROM requests WHERE tenant_id = :t AND status = 'succeeded'"
                    " AND compute_end_at >= to_timestamp(:a) AND compute_end_at < to_timestamp(:b)"
                ),
                {"t": tid, "a": t0, "b": t1},
            ).scalar_one()
            ledger = conn.execute(
                text(
                    "SELECT coalesce(sum((s.value ->> 0)::float8), 0) / 1000 FROM batches b,"
                    " jsonb_each(b.shares -> 'paid') s WHERE s.key = :t"
                    " AND b.compute_end_at >= to_timestamp(:a)"
                    " AND b.compute_end_at < to_timestamp(:b)"
                ),
                {"t": tid, "a": t0, "b": t1},
            ).scalar_one()
            out[name] = {"inputs": int(n), "ledger_s": round(float(ledger), 2)}
    return out


def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gm-fairdev-")))
        services = stack.enter_context(local_services(work))
        system = build_system(services, work, extra_env={"GRISTMILL_FAIR_SHARE_BY": mode})
        stack.callback(system.close)
        system.start_scheduler(workers=1, models=MODEL)
        system.url = system.start_api()
        system.wait_until_serving(MODEL)
        ids: dict[str, str] = {}
        keys: dict[str, str] = {}
        for name in LENGTHS:
            ids[name], keys[name] = paid_tenant(system, name)  # weight 1
        time.sleep(2)  # the load reports reach the API
        start = time.time()
        until = start + args.warm + args.runs * args.window
        shape = {
            "short": (args.short_inputs, args.short_loops),
            "long": (args.long_inputs, args.long_loops),
        }

        async def load(names: list[str], until: float) -> list[Counter[int]]:
            return await asyncio.gather(
                *(
                    closed_loop(
                        system.url,
                        keys[name],
                        texts(LENGTHS[name], 512, seed=i),
                        *shape[name],
                        until,
                    )
                    for i, name in enumerate(names)
                )
            )

        answered = dict(zip(LENGTHS, asyncio.run(load(list(LENGTHS), until)), strict=True))
        cost_ms: dict[str, float] = {}
        for name in LENGTHS:
            a = time.time()
            asyncio.run(load([name], a + args.solo))
            # the other tenant's queue drains in the first seconds
            cost_ms[name] = solo_cost_ms(system, a + args.solo / 3, a + args.solo)
        time.sleep(3)  # the last batches' rows are written
        windows = []
        for k in range(args.runs):
            a = start + args.warm + k * args.window
            w = window_counts(system, ids, a, a + args.window)
            for name in LENGTHS:
                w[name]["device_s"] = round(w[name]["inputs"] * cost_ms[name] / 1000, 2)
            for basis in ("device_s", "ledger_s"):
                s, lg = w["short"][basis], w["long"][basis]
                w[f"short_share_{basis}"] = round(s / (s + lg), 3) if s + lg else None
                w[f"ratio_{basis}"] = round(s / lg, 3) if lg else None
            w["inputs_ratio"] = (
                round(w["short"]["inputs"] / w["long"]["inputs"], 2)
                if w["long"]["inputs"]
                else None
            )
            windows.append(w)
    med = {
        key: statistics.median(x for w in windows if (x := w[key]) is not None)
        for key in ("ratio_device_s", "ratio_ledger_s", "short_share_device_s", "inputs_ratio")
    }
    return {
        "mode": mode,
        "statuses": {name: dict(c) for name, c in answered.items()},
        "solo_ms_an_item": cost_ms,
        "windows": windows,
        "median": med,
    }


def draw(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.2))
    modes = [r["mode"] for r in report["modes"]]
    for i, basis in enumerate(("device_s", "ledger_s")):
        for j, r in enumerate(report["modes"]):
            ys = [w[f"short_share_{basis}"] for w in r["windows"]]
            ax.scatter(
                [j + (i - 0.5) * 0.15] * len(ys),
                ys,
                s=25,
                c="tab:blue" if i == 0 else "tab:orange",
                label=(["solo cost x inputs", "ledger (split of measured)"][i] if j == 0 else None),
            )
    ax.axhline(0.5, color="k", lw=1, ls="--", label="entitled (equal weights)")
    ax.axhspan(
        0.5 / 1.1 / (0.5 / 1.1 + 0.5),
        0.55 / (0.55 + 0.5),
        color="g",
        alpha=0.1,
        label="within 10% of equal",
    )
    ax.set_xticks(range(len(modes)), [f"fair queue counts\n{m}" for m in modes])
    ax.set(
        ylabel="8-token tenant's share of device time",
        ylim=(0, 1),
        title="two tenants of equal weight, 8- vs 256-token inputs, both backlogged",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--runs", type=int, default=3, help="measured windows per mode")
    ap.add_argument("--window", type=float, default=30.0, help="seconds per window")
    ap.add_argument("--warm", type=float, default=15.0, help="seconds before the first window")
    ap.add_argument("--solo", type=float, default=15.0, help="seconds of each tenant alone")
    # Backlogged: many times more inputs outstanding than the two batches a worker holds
    # (running and queued on it) can take, whichever rule fills them; 128 short and 32
    # long ones were not (the batches in flight held them all at times).
    ap.add_argument("--short-inputs", type=int, default=32)
    ap.add_argument("--short-loops", type=int, default=32)
    ap.add_argument("--long-inputs", type=int, default=8)
    ap.add_argument("--long-loops", type=int, default=32)
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"args": vars(args) | {"out": str(args.out)}}
    report["modes"] = []
    for mode in args.modes.split(","):
        print(f"mode {mode} ...")
        r = run_mode(mode, args)
        print(json.dumps(r, indent=1))
        report["modes"].append(r)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = args.out / f"fairness-device-{stamp}.json"
    path.write_text(json.dumps(report, indent=2))
    draw(report, path.with_suffix(".png"))
    print(f"wrote {path} and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
