"""``gristmill models replay``: recorded traffic re-run against a candidate version.

The request log keeps each sync request's input and parameters. A replay takes the
requests of one model recorded since a given time (not those of the candidate itself),
sends each input again, pinned to the candidate, into the jobs topic: background
priority, so the replay runs in the capacity live traffic leaves, like a job. Its
requests belong to a tenant of their own (``gristmill-replay``), so no customer's
request log shows them; their ids derive from the replay and the original request, so
a replay run twice does not compute twice. The candidate's rows are then compared with
the recorded ones (gristmill/replay_report.py) per tenant tier: agreement, error rates,
model latency. A generation model's prompts run at temperature 0 (decision 67): on the
candidate, and again on the recorded version where the recorded answer was sampled, so
both sides are the models' greedy text and exact match means something; the report
adds a token-level similarity. The verdict is stored with the registry (``model_replays``), where
``gristmill models promote --require-replay`` looks for it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from sqlalchemy import Engine, any_, bindparam, select
from sqlalchemy.dialects.postgresql import ARRAY, UUID

from core.config import Settings
from core.errors import Conflict, GristmillError, InvalidInput, NotFound
from core.kafka import producer_config
from core.messages import RequestMessage
from core.models.causal_lm import DEFAULT_TEMPERATURE, CausalLMSpec, codec
from core.models.registry import VersionState, parse_ref, spec_from_record
from core.topics import request_topic
from core.vocab import PriorityClass, RequestStatus
from gristmill.replay_report import AUTO, Pair, Report, Thresholds, compare
from results import modelregistry
from results.schema import requests, tenants
from results.tenants import create_tenant, get_tenant
from results.vectors import EncodingFormat, answer_output

FLOAT = EncodingFormat.FLOAT  # a stored vector compares as the floats it answers

log = logging.getLogger(__name__)

REPLAY_TENANT = "gristmill-replay"
_NS = uuid.UUID("6f1d2c4e-8a35-4c1b-9f0e-2b7d5a9c3e01")
FETCH_CHUNK = 1000  # ids per lookup of the candidate's rows


@dataclass(frozen=True)
class Recorded:
    request_id: str
    tier: str
    input: Any
    params: dict[str, Any]
    ok: bool
    output: Any
    compute_ms: float | None
    version: str = ""


def parse_since(text: str) -> timedelta:
    """``90s``, ``15m``, ``1h``, ``2d`` -> a duration."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip()
    if len(text) < 2 or text[-1] not in units or not text[:-1].replace(".", "", 1).isdigit():
        raise InvalidInput("--since is a number and a unit: 90s, 15m, 1h, 2d", field="since")
    return timedelta(seconds=float(text[:-1]) * units[text[-1]])


def _ms(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else (end - start).total_seconds() * 1000


def recorded(
    engine: Engine, name: str, candidate: str, since: datetime, limit: int, baseline: str = ""
) -> list[Recorded]:
    """The most recent ``limit`` sync requests to ``name`` since ``since``, answered by
    another version than the candidate (``baseline`` only, when given)."""
    q = (
        select(
            requests.c.request_id,
            tenants.c.tier,
            requests.c.input,
            requests.c.params,
            requests.c.status,
            requests.c.output,
            requests.c.output_vector,
            requests.c.compute_start_at,
            requests.c.compute_end_at,
            requests.c.model_version,
        )
        .join(tenants, tenants.c.id == requests.c.tenant_id)
        .where(
            requests.c.model == name,
            requests.c.model_version != candidate,
            requests.c.received_at >= since,
            requests.c.input.is_not(None),
            requests.c.job_id.is_(None),
            requests.c.status.in_([RequestStatus.SUCCEEDED, RequestStatus.FAILED]),
            tenants.c.name != REPLAY_TENANT,
        )
        .order_by(requests.c.received_at.desc())
        .limit(limit)
    )
    if baseline:
        q = q.where(requests.c.model_version == baseline)
    with engine.connect() as conn:
        rows = conn.execute(q).all()
    return [
        Recorded(
            str(r.request_id),
            r.tier,
            r.input,
            dict(r.params or {}),
            r.status == RequestStatus.SUCCEEDED,
            # A vector is stored apart (decision 29), not in ``output``.
            answer_output(r.output, r.output_vector, FLOAT),
            _ms(r.compute_start_at, r.compute_end_at),
            r.model_version,
        )
        for r in rows
    ]


def _replay_tenant(engine: Engine) -> str:
    with engine.begin() as conn:
        try:
            return get_tenant(conn, REPLAY_TENANT).id
        except NotFound:
            return create_tenant(conn, REPLAY_TENANT, "free").id


def replay_id_for(replay_id: str, original: str) -> str:
    return str(uuid.uuid5(_NS, f"{replay_id}\x00{original}"))


def greedy(params: dict[str, Any]) -> dict[str, Any]:
    """A generation request's parameters at temperature 0 (no seed: nothing is drawn)."""
    return {k: v for k, v in params.items() if k != "seed"} | {"temperature": 0.0}


def sampled(params: dict[str, Any]) -> bool:
    """Whether a recorded generation answer was drawn (not greedy)."""
    t = params.get("temperature", DEFAULT_TEMPERATURE)
    return not isinstance(t, int | float) or t != 0


@dataclass
class Outcome:
    replay_id: str
    report: Report
    pairs: list[Pair]


def run_replay(
    settings: Settings,
    engine: Engine,
    *,
    candidate: str,
    since: timedelta,
    actor: str,
    limit: int = 2000,
    baseline: str = "",
    timeout_s: float = 600.0,
    thresholds: Thresholds = Thresholds(),
    mode: str = AUTO,
    progress: Callable[[int, int], None] | None = None,
) -> Outcome:
    name, version = parse_ref(candidate)
    if not version:
        raise InvalidInput("name the candidate as name@version", field="candidate")
    with engine.connect() as conn:
        m = modelregistry.load(conn, name)
    record = m.get(version)
    if record.state is VersionState.RETIRED:
        raise Conflict(f"{record.ref} is retired; it serves nothing")
    spec = spec_from_record(record, settings)
    started = datetime.now(UTC)
    originals = recorded(engine, name, version, started - since, limit, baseline)
    with engine.begin() as conn:
        replay_id = modelregistry.start_replay(conn, name, version, actor, started - since)
    tenant_id = _replay_tenant(engine)
    deadline = time.time() + timeout_s
    generating = isinstance(spec, CausalLMSpec)
    ids: dict[str, Recorded] = {}
    reruns: dict[str, str] = {}  # original id -> its greedy rerun on the recorded version
    refused: dict[str, str] = {}  # original id -> why the candidate cannot take it
    producer = Producer(producer_config(settings))
    topic = request_topic(settings, PriorityClass.JOBS)
    now = time.time()
    for r in originals:
        rid = replay_id_for(replay_id, r.request_id)
        try:
            spec.validate_input(r.input)
            params = spec.normalize_params(greedy(r.params) if generating else r.params)
        except GristmillError as exc:  # the candidate does not accept what was asked
            refused[r.request_id] = exc.message
            continue
        runs = [(rid, version)]
        if generating and sampled(r.params) and r.version:
            reruns[r.request_id] = replay_id_for(replay_id, f"greedy\x00{r.request_id}")
            runs.append((reruns[r.request_id], r.version))
        for run_id, pinned in runs:
            msg = RequestMessage(
                request_id=run_id,
                tenant_id=tenant_id,
                priority=PriorityClass.JOBS,
                model=name,
                version=pinned,
                input=spec.message_input(r.input),
                params=params,
                deadline=deadline,
                received_at=now,
                extra={"replay": replay_id, "of": r.request_id},
            )
            producer.produce(topic, msg.encode())
            producer.poll(0)
        ids[rid] = r
    if producer.flush(30) != 0:
        raise GristmillError("Kafka did not take every replayed request within 30 s")
    answers = _wait(engine, [*ids, *reruns.values()], deadline, progress)
    pairs = []
    for rid, r in ids.items():
        a = answers.get(rid)
        ok, output = r.ok, r.output
        if r.request_id in reruns:  # compared with the recorded version's greedy text
            b = answers.get(reruns[r.request_id])
            ok = b is not None and b["status"] == RequestStatus.SUCCEEDED
            output = None if b is None else b["output"]
        pairs.append(
            Pair(
                r.tier,
                ok,
                output,
                r.compute_ms,
                None if a is None else a["status"] == RequestStatus.SUCCEEDED,
                None if a is None else answer_output(a["output"], a["output_vector"], FLOAT),
                None if a is None else _ms(a["compute_start_at"], a["compute_end_at"]),
            )
        )
    for orig, _why in refused.items():
        r = next(x for x in originals if x.request_id == orig)
        pairs.append(Pair(r.tier, r.ok, r.output, r.compute_ms, False))
    tokenize = codec().encode if generating else str.split
    report = compare(pairs, thresholds, mode, tokenize)
    summary = report.as_dict()
    summary["refused"] = len(refused)
    summary["greedy_reruns"] = len(reruns)
    summary["since"] = str(since)
    with engine.begin() as conn:
        modelregistry.finish_replay(conn, replay_id, len(pairs), report.passed, summary)
    return Outcome(replay_id, report, pairs)


_FETCH = select(
    requests.c.request_id,
    requests.c.status,
    requests.c.output,
    requests.c.output_vector,
    requests.c.compute_start_at,
    requests.c.compute_end_at,
).where(requests.c.request_id == any_(bindparam("ids", type_=ARRAY(UUID(as_uuid=False)))))


def _wait(
    engine: Engine,
    ids: list[str],
    deadline: float,
    progress: Callable[[int, int], None] | None,
) -> dict[str, dict[str, Any]]:
    """The candidate's rows, polled until all are in or ``deadline`` (epoch s) passes."""
    got: dict[str, dict[str, Any]] = {}
    while True:
        left = [i for i in ids if i not in got]
        for k in range(0, len(left), FETCH_CHUNK):
            with engine.connect() as conn:
                for row in conn.execute(_FETCH, {"ids": left[k : k + FETCH_CHUNK]}):
                    got[str(row.request_id)] = dict(row._mapping)
        if progress is not None:
            progress(len(got), len(ids))
        if len(got) == len(ids) or time.time() > deadline:
            return got
        time.sleep(1.0)


def write_chart(report: Report, path: Path, title: str) -> None:
    """Agreement, error rates and p95 model latency per tier, recorded vs candidate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [*report.tiers, report.overall]
    names = [g.name for g in groups]
    xs = range(len(groups))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    ax = axes[0]
    ax.bar(xs, [g.row()["agreement"] * 100 for g in groups], color="tab:blue")
    ax.axhline(report.thresholds.min_agreement * 100, color="grey", ls="--", lw=0.8)
    ax.set(title=f"agreement ({report.mode})", ylabel="% of compared requests", ylim=(0, 105))
    ax.set_xticks(list(xs), names)

    def side_by_side(
        ax: Any, recorded: list[float], candidate: list[float], color: str, **labels: str
    ) -> None:
        """Each tier's recorded bar (grey) beside the candidate's."""
        w = 0.4
        ax.bar([x - w / 2 for x in xs], recorded, w, label="recorded", color="tab:grey")
        ax.bar([x + w / 2 for x in xs], candidate, w, label="candidate", color=color)
        ax.set(**labels)
        ax.set_xticks(list(xs), names)
        ax.legend()

    side_by_side(
        axes[1],
        [g.row()["original_error_rate"] * 100 for g in groups],
        [g.row()["candidate_error_rate"] * 100 for g in groups],
        "tab:red",
        title="errors",
        ylabel="% of requests",
    )
    side_by_side(
        axes[2],
        [g.latency(95)[0] for g in groups],
        [g.latency(95)[1] for g in groups],
        "tab:green",
        title="p95 model latency (batch compute)",
        ylabel="ms",
    )
    verdict = "passed" if report.passed else "failed"
    fig.suptitle(f"{title}: {verdict}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
