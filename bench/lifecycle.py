"""Model lifecycle under load, and a large job through the HTTP backend while the
service behind it restarts.

    python -m bench.lifecycle rollout --rate 500 --seconds 30
    python -m bench.lifecycle http --items 100000

``rollout``: sim versions 1 and 2 of a model of its own (2 answers differently, so each
answer can be checked against the version it names). An open-loop run at ``--rate``
with no change (the baseline), then the same run with a promote of 2 at a third and a
rollback at two thirds. Reports p95 of both, every non-200, every answer that does not
match its version, and when the switch reached the API; a chart of the second run.

``http``: a real single-item HTTP service (bench/upstream.py) registered with the
``http`` backend; a job of ``--items`` items, the service killed when ``--kill-at`` of
it is done and started again ``--down-s`` later. Reports whether every item succeeded
with the service's own answer, in order, and the throughput; a chart of progress.

Each starts its own Kafka and PostgreSQL on loopback (or uses KAFKA_BOOTSTRAP /
DATABASE_URL) and writes JSON and a PNG under ``--out`` (default bench-out/).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import orjson
from gristmill_client import Client

from bench.charts import _plt
from bench.openloop import RunResult, run_open_loop
from bench.upstream import UpstreamProcess, upstream_output
from core.config import load_settings
from core.models import lifecycle
from core.models.registry import new_record
from core.models.sim import sim_output
from gristmill.devservices.stack import System, build_system, local_services
from results import modelregistry
from results.db import make_engine

ACTOR = "bench.lifecycle"
VARIANTS = {"1": "", "2": "two"}  # version -> sim variant (its answers differ)


def _system(stack: ExitStack, extra_env: dict[str, str] | None = None) -> System:
    work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gm-lifecycle-")))
    services = stack.enter_context(local_services(work))
    system = build_system(services, work, extra_env=extra_env)
    stack.callback(system.close)
    return system


def _register(system: System, ref: str, backend: str, config: dict[str, Any], batch: int) -> None:
    settings = load_settings()
    record = new_record(
        ref, backend=backend, max_batch_size=batch, config=config, settings=settings
    )
    with make_engine(system.settings.database_url).begin() as conn:
        modelregistry.register(conn, record, ACTOR)


def _promote(system: System, name: str, version: str) -> None:
    with make_engine(system.settings.database_url).begin() as conn:
        modelregistry.promote(conn, name, version, ACTOR)


def _rollback(system: System, name: str) -> None:
    with make_engine(system.settings.database_url).begin() as conn:
        modelregistry.apply(conn, name, lambda m: lifecycle.rollback(m, None), ACTOR)


def _until_ok(system: System, ref: str, timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        r = httpx.post(
            f"{system.url}/v1/infer",
            json={"model": ref, "input": "warm"},
            headers=system.headers("enterprise"),
            timeout=30,
        )
        if r.status_code == 200:
            return
        time.sleep(0.5)
    raise RuntimeError(f"{ref} never served")


# ---- rollout ----------------------------------------------------------------------------
def _open_loop(system: System, name: str, rate: float, seconds: float, tag: str) -> RunResult:
    return asyncio.run(
        run_open_loop(
            url=f"{system.url}/v1/infer",
            headers=system.headers("enterprise"),
            rate=rate,
            count=int(rate * seconds),
            make_body=lambda i: {"model": name, "input": f"{tag}-{i}"},
        )
    )


def _check(run: RunResult, rate: float, tag: str) -> dict[str, Any]:
    """Non-200s, answers that do not match the version they name, versions seen."""
    errors: dict[str, int] = {}
    wrong = 0
    versions: dict[str, int] = {}
    for s in run.samples:
        if s.status != 200 or s.body is None:
            errors[str(s.status)] = errors.get(str(s.status), 0) + 1
            continue
        v = str(s.body["model_version"])
        versions[v] = versions.get(v, 0) + 1
        i = round(s.intended * rate)
        if s.body["output"] != sim_output(f"{tag}-{i}", variant=VARIANTS.get(v, "?")):
            wrong += 1
    return {"errors": errors, "wrong_answers": wrong, "versions": versions}


def rollout(rate: float, seconds: float, out: Path) -> dict[str, Any]:
    name = f"ro-{uuid.uuid4().hex[:6]}"
    with ExitStack() as stack:
        system = _system(stack)
        for v, variant in VARIANTS.items():
            _register(system, f"{name}@{v}", "sim", {"batch_ms": 50, "variant": variant}, 100)
        _promote(system, name, "1")
        system.start_scheduler(workers=2, models=f"sim,{name}")
        system.url = system.start_api()
        system.wait_until_serving(name)
        _until_ok(system, f"{name}@2")  # the staged version is loaded before the promote
        _open_loop(system, name, rate, 5, "warm")
        tag = uuid.uuid4().hex[:6]
        baseline = _open_loop(system, name, rate, seconds, tag)
        marks: dict[str, float] = {}
        t0 = time.perf_counter()

        def operator() -> None:
            time.sleep(seconds / 3)
            marks["promote_s"] = time.perf_counter() - t0
            _promote(system, name, "2")
            time.sleep(seconds / 3)
            marks["rollback_s"] = time.perf_counter() - t0
            _rollback(system, name)

        op = threading.Thread(target=operator)
        tag2 = uuid.uuid4().hex[:6]
        op.start()
        changed = _open_loop(system, name, rate, seconds, tag2)
        op.join()
    switch = _switch_times(changed, marks)
    report = {
        "rate": rate,
        "seconds": seconds,
        "baseline": {**baseline.summary(), **_check(baseline, rate, tag)},
        "with_promote_and_rollback": {**changed.summary(), **_check(changed, rate, tag2)},
        "p95_ratio": round(changed.percentile(95) / baseline.percentile(95), 3),
        "marks_s": {k: round(v, 2) for k, v in marks.items()},
        "switch_s": switch,
    }
    _rollout_chart(changed, marks, baseline.percentile(95), out / "lifecycle-rollout.png")
    return report


def _switch_times(run: RunResult, marks: dict[str, float]) -> dict[str, float | None]:
    """Seconds from each command until every later request was answered by the new
    version (the last answer of the old one, by intended send time)."""
    out: dict[str, float | None] = {}
    for key, old, end in (("promote", "1", "rollback_s"), ("rollback", "2", None)):
        at = marks.get(f"{key}_s")
        if at is None:
            out[key] = None
            continue
        stop = marks.get(end, float("inf")) if end else float("inf")
        last_old = max(
            (
                s.intended
                for s in run.samples
                if s.body is not None
                and at <= s.intended < stop
                and str(s.body["model_version"]) == old
            ),
            default=at,
        )
        out[key] = round(last_old - at, 3)
    return out


def _rollout_chart(run: RunResult, marks: dict[str, float], base_p95: float, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for v, color in (("1", "tab:blue"), ("2", "tab:orange")):
        pts = [
            (s.intended, s.latency_ms)
            for s in run.samples
            if s.body is not None and str(s.body["model_version"]) == v
        ]
        if pts:
            ax.scatter(*zip(*pts, strict=True), s=2, color=color, label=f"answered by @{v}")
    bad = [(s.intended, s.latency_ms) for s in run.samples if s.status != 200]
    if bad:
        ax.scatter(*zip(*bad, strict=True), s=8, color="red", label="not 200")
    for key, at in marks.items():
        ax.axvline(at, color="black", linestyle="--", linewidth=1)
        ax.text(at, ax.get_ylim()[1] * 0.95, key.removesuffix("_s"), ha="left")
    ax.axhline(base_p95, color="gray", linewidth=1, label=f"baseline p95 {base_p95:.0f} ms")
    ax.set_xlabel("send time (s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"promote and rollback at {run.rate:.0f} req/s")
    ax.legend(loc="upper right", markerscale=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---- http -------------------------------------------------------------------------------
def http_job(items: int, kill_at: float, down_s: float, out: Path) -> dict[str, Any]:
    name = f"up-{uuid.uuid4().hex[:6]}"
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gm-up-")))
        upstream = UpstreamProcess(work / "upstream.log", 2.0)
        upstream.start()
        stack.callback(upstream.kill)
        system = _system(stack)
        config = {
            "url": f"{upstream.url}/predict",
            "request_template": {"text": "{{input}}"},
            "response_path": "result",
            "concurrency": 8,
            "timeout_ms": 2000,
        }
        _register(system, f"{name}@1", "http", config, 32)
        _promote(system, name, "1")
        system.start_scheduler(workers=2, models=f"sim,{name}")
        system.url = system.start_api()
        system.wait_until_serving(name)
        tag = uuid.uuid4().hex[:6]
        src = work / "items.jsonl"
        with src.open("wb") as f:
            f.write(b"".join(orjson.dumps({"input": f"{tag}-{i}"}) + b"\n" for i in range(items)))
        gm = Client(system.url, system.keys["paid"], timeout_s=3600)
        t0 = time.time()
        job_id = gm.submit_job(name, src)["job_id"]
        progress: list[tuple[float, int]] = []
        killed_at = restarted_at = None
        failed_while_down = 0
        while True:
            j = gm.job(job_id)
            now = time.time() - t0
            done = j["counts"]["succeeded"]
            progress.append((now, done))
            if killed_at is None and done >= kill_at * items:
                upstream.kill()
                killed_at = now
            if killed_at is not None and restarted_at is None and now - killed_at >= down_s:
                failed_while_down = j["counts"]["failed"]
                upstream.start()
                restarted_at = time.time() - t0
            if j["status"] in ("completed", "failed", "cancelled", "expired") and j["finished_at"]:
                break
            time.sleep(0.5)
        run_s = time.time() - t0
        wrong = checked = 0
        for item in gm.iter_results(job_id):
            if item["index"] != checked or item["output"] != upstream_output(f"{tag}-{checked}"):
                wrong += 1
            checked += 1
    report = {
        "items": items,
        "status": j["status"],
        "counts": j["counts"],
        "checked": checked,
        "wrong_or_out_of_order": wrong,
        "failed_while_down": failed_while_down,
        "killed_at_s": round(killed_at or 0, 1),
        "restarted_at_s": round(restarted_at or 0, 1),
        "end_to_end_s": round(run_s, 1),
        "items_per_s": round(items / run_s),
        "upstream_delay_ms": 2.0,
        "concurrency_per_worker": 8,
        "workers": 2,
    }
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([p[0] for p in progress], [p[1] for p in progress], color="tab:blue")
    if killed_at is not None and restarted_at is not None:
        ax.axvspan(killed_at, restarted_at, color="red", alpha=0.15, label="service down")
    ax.set_xlabel("seconds since submit")
    ax.set_ylabel("items succeeded")
    ax.set_title(f"{items:,}-item job through the HTTP backend, service restarted")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "lifecycle-http.png", dpi=110)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.lifecycle")
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("rollout")
    r.add_argument("--rate", type=float, default=500)
    r.add_argument("--seconds", type=float, default=30)
    h = sub.add_parser("http")
    h.add_argument("--items", type=int, default=100_000)
    h.add_argument("--kill-at", type=float, default=0.3, help="share done when it is killed")
    h.add_argument("--down-s", type=float, default=10)
    for p in (r, h):
        p.add_argument("--out", type=Path, default=Path("bench-out"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.cmd == "rollout":
        report = rollout(args.rate, args.seconds, args.out)
    else:
        report = http_job(args.items, args.kill_at, args.down_s, args.out)
    path = args.out / f"lifecycle-{args.cmd}.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
