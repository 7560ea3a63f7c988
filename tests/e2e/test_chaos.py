"""Short chaos runs in the suite: three Kafka brokers (RF 3, min ISR 2), PostgreSQL,
two APIs, two schedulers; under load, one broker, one worker and one scheduler killed
with -9; a scheduler, a broker and PostgreSQL frozen; a scheduler and an API cut off
by the network; then the audit. The long run is ``gristmill chaos --rounds 50``."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.models.sim import sim_output
from gristmill.chaos import netns
from gristmill.chaos.audit import Row, audit
from gristmill.chaos.ledger import JobOutcome, Outcome
from gristmill.chaos.runner import ChaosConfig, ChaosReport, run_chaos


def short_run(tmp_path: Path, kinds: tuple[str, ...], seed: int) -> ChaosReport:
    """One fault of each kind at 20 requests/s, then the audit, which must pass."""
    cfg = ChaosConfig(
        rounds=len(kinds),
        rate=20,
        seed=seed,
        kinds=kinds,
        workdir=tmp_path,
        warmup_s=3,
        calm_s=2,
        progress=False,
    )
    report = run_chaos(cfg)
    print(report.text())
    t = report.audit.total
    assert report.ok, report.text()
    assert {f.kind for f in report.faults} == set(kinds)
    assert t.accepted > 100 and t.persisted == t.accepted
    assert t.job_items_persisted == t.job_items
    assert all(f.recovery_s is not None for f in report.faults)
    # The durability ledger, the second witness, read the whole run (decision 54).
    assert report.witness is not None and report.witness.complete, report.text()
    return report


@pytest.mark.slow
def test_short_chaos_run_loses_duplicates_and_corrupts_nothing(tmp_path: Path) -> None:
    report = short_run(tmp_path, ("broker", "worker", "scheduler"), seed=4)
    # The audit's own verdict (nothing lost, duplicated or wrong), beside short_run's.
    assert report.audit.ok, report.text()


@pytest.mark.slow
def test_short_chaos_run_with_freezes(tmp_path: Path) -> None:
    # A frozen scheduler (past its consumer session, its partitions move while it
    # sleeps and it wakes with stale work), a frozen broker and a frozen database.
    report = short_run(tmp_path, ("freeze-scheduler", "freeze-broker", "freeze-postgres"), 11)
    assert all("SIGSTOP" in f.detail for f in report.faults)
    assert (report.workdir / "recovery.png").exists()


@pytest.mark.slow
@pytest.mark.skipif(not netns.available(), reason="no network namespaces here (root, iproute2)")
def test_short_chaos_run_with_partitions(tmp_path: Path) -> None:
    # The scheduler and the API that run in namespaces of their own are cut off from
    # Kafka, PostgreSQL or both for 8 s each, then joined again.
    report = short_run(tmp_path, ("cut-scheduler", "cut-api"), seed=5)
    assert all(f.detail.startswith("cut from") for f in report.faults)


# ---- the audit itself, on made-up ledgers (fast, no services) -------------------------


def _ok(seq: int, x: str, rid: str) -> Outcome:
    o = Outcome(seq=seq, api=0, tier="paid", input=x, salt="", sent_at=float(seq))
    o.status, o.request_id, o.output = 200, rid, sim_output(x)
    return o


def _row(rid: str, x: str | None, output: object, **kw: object) -> Row:
    fields: dict[str, object] = {"salt": "", "status": "succeeded", "error": None}
    fields.update({"job_id": None, "item_index": None, **kw})
    return Row(request_id=rid, input=x, output=output, **fields)  # type: ignore[arg-type]


def test_audit_counts_lost_duplicated_wrong_and_refused() -> None:
    outcomes = [_ok(0, "a", "r0"), _ok(1, "b", "r1"), _ok(2, "c", "r2"), _ok(3, "d", "r3")]
    timed_out = Outcome(seq=4, api=0, tier="paid", input="e", salt="", sent_at=4.0, status=504)
    refused = Outcome(seq=5, api=1, tier="paid", input="f", salt="", sent_at=5.0, status=503)
    rows = [
        _row("r0", "a", sim_output("a")),  # right
        _row("r2", "c", sim_output("c")),  # two rows for one request
        _row("rX", "c", sim_output("c")),
        _row("r3", "d", sim_output("not d")),  # someone else's output
        _row("r6", "f", sim_output("f")),  # refused but processed: allowed
    ]  # "b" (200) and "e" (504) have no row: lost
    res = audit([*outcomes, timed_out, refused], [], rows, lambda t: "k")
    t = res.total
    assert (t.accepted, t.persisted, t.lost, t.duplicated, t.wrong) == (5, 1, 2, 1, 1)
    assert (t.s503, t.s504, t.refused_persisted) == (1, 1, 1)
    assert not res.ok


def test_audit_matches_job_items_by_index_and_finds_refused_jobs() -> None:
    accepted = JobOutcome(seq=0, api=0, tier="paid", salt="", inputs=["x0", "x1"], sent_at=0.0)
    accepted.status, accepted.job_id = 202, "J1"
    cut = JobOutcome(seq=1, api=1, tier="paid", salt="", inputs=["y0"], sent_at=1.0)
    rows = [
        _row("i0", None, sim_output("x0"), job_id="J1", item_index=0),
        _row("i1", None, sim_output("x1"), job_id="J1", item_index=1),
        _row("i2", None, sim_output("y0"), job_id="J2", item_index=0),
    ]
    res = audit([], [accepted, cut], rows, lambda t: "k", job_ids={"y0": "J2"})
    assert res.ok and res.stray_rows == 0
    assert (res.total.job_items, res.total.job_items_persisted) == (2, 2)
    assert res.total.refused_persisted == 1
    assert not audit([], [accepted, cut], rows, lambda t: "k").ok  # J2 unexplained: stray
