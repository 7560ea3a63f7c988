"""The audit: PostgreSQL against what the clients were told.

* Every request answered 200 has exactly one row, with the request id the
  client got, status ``succeeded`` and the output ``sim`` derives from its own
  input and salt (and the client got that same output).
* Every request answered 504 was accepted (it was in Kafka before the deadline
  passed), so it must have exactly one row too (any final status).
* Requests refused (503) or cut off (connection error) may or may not have a
  row; that is counted, never more than one row though.
* Every item of an accepted job (202) has exactly one row with its own output.
* Every row written for this run's tenants is checked for a wrong output.

Rows are matched by input, which is unique per request, so a second row for the
same logical request is visible even though the primary key is the request id.
Job item rows keep their input in ``job_items``; they are matched by job id and
item index, and their output is checked against the input the client sent.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from sqlalchemy import Engine, select

from core.models.sim import sim_output
from core.vocab import RequestStatus
from gristmill.chaos.ledger import CONN_ERROR, JobOutcome, Outcome
from results.schema import job_items, jobs, requests


@dataclass
class Tally:
    sent: int = 0
    accepted: int = 0  # 200 + 504
    persisted: int = 0  # accepted and found exactly once, right
    lost: int = 0
    duplicated: int = 0
    wrong: int = 0
    s503: int = 0
    s504: int = 0
    conn: int = 0  # no HTTP answer
    other: int = 0  # any other status
    refused_persisted: int = 0  # 503 / connection error, yet processed (allowed)
    job_items: int = 0  # items of accepted jobs
    job_items_persisted: int = 0


@dataclass
class Row:
    request_id: str
    input: Any
    salt: str
    status: str
    output: Any
    error: str | None
    job_id: str | None
    item_index: int | None


@dataclass
class AuditResult:
    by_kind: dict[str, Tally] = field(default_factory=dict)
    total: Tally = field(default_factory=Tally)
    problems: list[str] = field(default_factory=list)  # the first few, for a human
    stray_rows: int = 0  # rows of our tenants that match no request sent

    @property
    def ok(self) -> bool:
        t = self.total
        return t.lost == 0 and t.duplicated == 0 and t.wrong == 0 and self.stray_rows == 0

    def note(self, msg: str) -> None:
        if len(self.problems) < 30:
            self.problems.append(msg)


def fetch_rows(engine: Engine, tenant_ids: list[str]) -> list[Row]:
    stmt = select(
        requests.c.request_id,
        requests.c.input,
        requests.c.params,
        requests.c.status,
        requests.c.output,
        requests.c.error,
        requests.c.job_id,
        requests.c.item_index,
    ).where(requests.c.tenant_id.in_(tenant_ids))
    with engine.connect() as conn:
        return [
            Row(
                str(r.request_id),
                r.input,
                str((r.params or {}).get("salt", "")),
                r.status,
                r.output,
                r.error,
                str(r.job_id) if r.job_id else None,
                r.item_index,
            )
            for r in conn.execute(stmt)
        ]


def fetch_job_ids(engine: Engine, tenant_ids: list[str]) -> dict[str, str]:
    """First item's input -> job id, for every job of the run's tenants. Finds the jobs
    whose submission the client saw fail but that were recorded and run anyway."""
    stmt = (
        select(job_items.c.input, job_items.c.job_id)
        .join(jobs, jobs.c.job_id == job_items.c.job_id)
        .where(jobs.c.tenant_id.in_(tenant_ids), job_items.c.item_index == 0)
    )
    with engine.connect() as conn:
        return {str(x): str(jid) for x, jid in conn.execute(stmt)}


def _right(row: Row, input_: str | None = None) -> bool:
    x = str(row.input) if input_ is None else input_
    return row.status != RequestStatus.SUCCEEDED or row.output == sim_output(x, row.salt)


def audit(
    outcomes: list[Outcome],
    jobs: list[JobOutcome],
    rows: list[Row],
    kind_of: Callable[[float], str],
    ignore_input: Callable[[str], bool] = lambda _: False,
    job_ids: dict[str, str] | None = None,
) -> AuditResult:
    res = AuditResult()
    by_input: dict[str, list[Row]] = defaultdict(list)
    by_job: dict[str, dict[int, list[Row]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.job_id is not None:
            by_job[r.job_id][r.item_index if r.item_index is not None else -1].append(r)
        else:
            by_input[str(r.input)].append(r)
    matched: set[str] = set()
    for o in outcomes:
        t = res.by_kind.setdefault(kind_of(o.sent_at), Tally())
        t.sent += 1
        found = by_input.get(o.input, [])
        matched.add(o.input)
        if len(found) > 1:
            t.duplicated += 1
            res.note(f"duplicated: #{o.seq} {o.input!r} has {len(found)} rows")
        if o.status == 200:
            t.accepted += 1
            _check_ok(o, found, t, res)
        elif o.status == 504:
            t.accepted += 1
            t.s504 += 1
            if not found:
                t.lost += 1
                res.note(f"lost: #{o.seq} answered 504 (id {o.request_id}) but has no row")
            elif len(found) == 1 and not _right(found[0]):
                t.wrong += 1
                res.note(f"wrong: #{o.seq} (504) row output {found[0].output}")
            elif len(found) == 1:
                t.persisted += 1
        else:
            if o.status == 503:
                t.s503 += 1
            elif o.status == CONN_ERROR:
                t.conn += 1
            else:
                t.other += 1
                res.note(f"status {o.status}: #{o.seq} {o.error}")
            if found:
                t.refused_persisted += 1
                if not all(_right(r) for r in found):
                    t.wrong += 1
                    res.note(f"wrong: #{o.seq} (status {o.status}) has a wrong row")
    known_jobs = {j.job_id for j in jobs if j.job_id}
    for j in jobs:
        t = res.by_kind.setdefault(kind_of(j.sent_at), Tally())
        if j.accepted:
            _check_job(j, by_job.get(j.job_id or "", {}), t, res)
            continue
        # Refused or cut off, yet recorded (and then run): allowed, but checked.
        jid = j.job_id or (job_ids or {}).get(j.inputs[0])
        if jid is None:
            continue
        known_jobs.add(jid)
        for idx, x in enumerate(j.inputs):
            found = by_job.get(jid, {}).get(idx, [])
            if found:
                t.refused_persisted += 1
            if len(found) > 1:
                t.duplicated += 1
                res.note(f"duplicated: item {idx} of job {jid} has {len(found)} rows")
            if not all(_right(r, x) for r in found):
                t.wrong += 1
                res.note(f"wrong: item {idx} of refused job {jid}")
    for f in fields(Tally):
        setattr(res.total, f.name, sum(getattr(t, f.name) for t in res.by_kind.values()))
    stray = [
        r
        for r in rows
        if (r.job_id is None and str(r.input) not in matched and not ignore_input(str(r.input)))
        or (r.job_id is not None and r.job_id not in known_jobs)
    ]
    res.stray_rows = len(stray)
    for r in stray[:5]:
        res.note(f"stray row {r.request_id} for input {r.input!r}, job {r.job_id}")
    for r in rows:
        if r.job_id is None and not _right(r):
            if str(r.input) not in matched:
                res.total.wrong += 1  # already counted per request when matched
            res.note(f"wrong output in row {r.request_id}: {r.output}")
    return res


def _check_ok(o: Outcome, found: list[Row], t: Tally, res: AuditResult) -> None:
    expected = sim_output(o.input, o.salt)
    if not found:
        t.lost += 1
        res.note(f"lost: #{o.seq} answered 200 (id {o.request_id}) but has no row")
        return
    if len(found) > 1:
        return  # counted as duplicated
    row = found[0]
    if (
        row.request_id != o.request_id
        or row.status != RequestStatus.SUCCEEDED
        or row.output != expected
        or o.output != expected
    ):
        t.wrong += 1
        res.note(
            f"wrong: #{o.seq} client got {o.request_id}/{o.output}, row {row.request_id}/"
            f"{row.status}/{row.output}, expected {expected}"
        )
        return
    t.persisted += 1


def _check_job(j: JobOutcome, items: dict[int, list[Row]], t: Tally, res: AuditResult) -> None:
    for idx, x in enumerate(j.inputs):
        t.job_items += 1
        found = items.get(idx, [])
        if not found:
            t.lost += 1
            res.note(f"lost: item {idx} of job {j.job_id} has no row")
        elif len(found) > 1:
            t.duplicated += 1
            res.note(f"duplicated: item {idx} of job {j.job_id} has {len(found)} rows")
        elif not _right(found[0], x):
            t.wrong += 1
            res.note(f"wrong: item {idx} of job {j.job_id}: {found[0]}")
        else:
            t.job_items_persisted += 1


def unsettled(outcomes: list[Outcome], jobs: list[JobOutcome], rows: list[Row]) -> int:
    """Accepted requests and job items that have no row yet (the drain waits for 0)."""
    have = {str(r.input) for r in rows if r.job_id is None}
    items = {(r.job_id, r.item_index) for r in rows if r.job_id is not None}
    n = sum(1 for o in outcomes if o.accepted and o.input not in have)
    return n + sum(
        1 for j in jobs if j.accepted for i in range(len(j.inputs)) if (j.job_id, i) not in items
    )
