"""``gristmill models``: the model registry's commands (docs/models.md).

They talk to PostgreSQL directly (``DATABASE_URL``), as ``gristmill tenants`` does, with
the same functions as the admin API (results/modelregistry.py); every change is
audited under the operating system user and host that made it. Replay also produces to
Kafka (``KAFKA_BOOTSTRAP``).
"""

from __future__ import annotations

import getpass
import json
import math
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from core.config import load_settings

if TYPE_CHECKING:
    from core.models.lifecycle import Change, ModelVersions

app = typer.Typer(help="Model versions: register, canary, promote, roll back, replay.")


def _actor() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()} (cli)"


def _fail(message: str) -> NoReturn:
    typer.secho(message, fg="red", err=True)
    raise typer.Exit(1)


def _engine() -> Any:
    from results.db import make_engine

    return make_engine(load_settings().database_url, pool_size=1)


def _run(fn: Any) -> Any:
    """``fn(conn)`` in one transaction; registry errors become a red line and exit 1."""
    from core.errors import GristmillError

    try:
        with _engine().begin() as conn:
            return fn(conn)
    except GristmillError as exc:
        _fail(exc.message)


def _show_change(change: Any) -> None:
    moves = ", ".join(
        f"{change.version if v == change.version else v} -> {s}"
        + (f" ({share:.0%})" if share else "")
        for v, (s, share) in change.states.items()
    )
    typer.echo(f"{change.action}: {moves}")


def _apply(name: str, decide: Callable[[ModelVersions], Change]) -> None:
    """One lifecycle decision on ``name``'s versions, written and audited in one
    transaction, then shown."""
    from results import modelregistry

    _show_change(_run(lambda conn: modelregistry.apply(conn, name, decide, _actor())))


@app.command("list")
def list_cmd(name: str | None = typer.Argument(None, help="one model; default: all")) -> None:
    """Versions with their state, canary share, digest and the workers serving them."""
    from results import modelregistry

    def read(conn: Any) -> tuple[Any, Any]:
        listed = modelregistry.list_versions(conn, name)
        stmt = modelregistry.readiness_stmt(load_settings().topic_prefix)
        ready = modelregistry.readiness_from_rows(conn.execute(stmt))
        return listed, ready

    listed, ready = _run(read)
    if not listed:
        typer.echo("no versions registered" + (f" for {name}" if name else ""))
        return
    typer.echo(
        f"{'model@version':<28}{'state':<9}{'share':>6}  {'backend':<10}{'sha256':<14}"
        f"{'workers':<22}created"
    )
    for x in listed:
        r = x.record
        s = ready.get((r.name, r.version))
        workers = (
            f"{s.ready} ready"
            + (f", {s.loading} loading" if s.loading else "")
            + (f", {s.unavailable} down" if s.unavailable else "")
            + (f", {s.failed} failed" if s.failed else "")
            if s
            else "-"
        )
        share = f"{r.canary_share:.0%}" if r.canary_share else ""
        mark = " (rollback target)" if x.previous_live == r.version else ""
        typer.echo(
            f"{r.ref:<28}{r.state:<9}{share:>6}  {r.backend:<10}{(r.sha256[:12] or '-'):<14}"
            f"{workers:<22}{x.created_at:%Y-%m-%d %H:%M} by {x.created_by}{mark}"
        )
        if s is not None and s.error:
            typer.secho(f"    {s.error}", fg="yellow")


@app.command()
def register(
    ref: str = typer.Argument(..., help="name@version"),
    backend: str = typer.Option(..., help="sim, embedding, http or causal-lm (gristmill-lm)"),
    artifact: str = typer.Option("", help="file or directory of the version's weights"),
    sha256: str = typer.Option(
        "", help="the artifact's sha256 (computed here when the artifact is readable)"
    ),
    config: str = typer.Option("{}", help="backend settings as JSON (docs/models.md)"),
    config_file: Path | None = typer.Option(None, help="... or read from this JSON file"),
    max_batch: int = typer.Option(64, help="the largest batch a worker runs"),
    memory_mb: float | None = typer.Option(
        None, help="memory it holds when loaded (default: the artifact's size)"
    ),
) -> None:
    """Register a new version (staged: it gets traffic only when pinned or canaried)."""
    from core.errors import GristmillError
    from core.models.artifact import ArtifactError, artifact_bytes, artifact_sha256
    from core.models.registry import new_record
    from results import modelregistry

    try:
        cfg = json.loads(config_file.read_text() if config_file else config)
    except (OSError, json.JSONDecodeError) as exc:
        _fail(f"--config is not JSON: {exc}")
    if not isinstance(cfg, dict):
        _fail("--config must be a JSON object")
    memory = int(memory_mb * 1_000_000) if memory_mb is not None else 0
    if artifact:
        path = Path(artifact)
        if path.exists():
            artifact = str(path.resolve())
            digest = artifact_sha256(path)
            if sha256 and sha256.lower() != digest:
                _fail(f"--sha256 {sha256} does not match the artifact's files ({digest})")
            sha256 = digest
            if memory_mb is None:
                memory = artifact_bytes(path)
        elif not sha256:
            _fail(f"{artifact} is not readable here: give its --sha256")
    try:
        record = new_record(
            ref,
            backend=backend,
            max_batch_size=max_batch,
            config=cfg,
            artifact=artifact,
            sha256=sha256,
            memory_bytes=memory,
            settings=load_settings(),
        )
    except (GristmillError, ArtifactError) as exc:
        _fail(getattr(exc, "message", str(exc)))
    _run(lambda conn: modelregistry.register(conn, record, _actor()))
    typer.echo(f"registered {record.ref} ({record.backend}) as staged")
    if record.sha256:
        typer.echo(f"sha256 {record.sha256}")


@app.command()
def canary(
    ref: str = typer.Argument(..., help="name@version"),
    share: float = typer.Option(..., help="of unpinned traffic: 0.1 for 10%"),
) -> None:
    """Send a share of the model's unpinned traffic to this version (sticky per tenant)."""
    from core.models import lifecycle

    name, version = _versioned(ref)
    _apply(name, lambda m: lifecycle.canary(m, version, share))


_TENANT = typer.Option(None, "--corpus-tenant", help="re-embed this tenant's corpus with it")
_JOB = typer.Option(None, "--corpus-job", help="... the items of this job of the tenant")
_SINCE = typer.Option(
    None, "--corpus-since", help="... or its sync requests from this ISO time (with zone)"
)
_UNTIL = typer.Option(None, "--corpus-until", help="... until this ISO time (default: now)")


@app.command()
def promote(
    ref: str = typer.Argument(..., help="name@version"),
    require_replay: bool = typer.Option(
        False, help="refuse unless a replay of recorded traffic against it passed"
    ),
    corpus_tenant: str | None = _TENANT,
    corpus_job: str | None = _JOB,
    corpus_since: str | None = _SINCE,
    corpus_until: str | None = _UNTIL,
) -> None:
    """Make this version live; the live one becomes the rollback target. With a corpus,
    also start re-embedding it with this version (a passing replay required)."""
    from results import modelregistry, reembed

    name, version = _versioned(ref)
    if corpus_tenant is None:
        if corpus_job or corpus_since or corpus_until:
            _fail("a corpus names its tenant: --corpus-tenant")
        change = _run(
            lambda conn: modelregistry.promote(
                conn, name, version, _actor(), require_replay=require_replay
            )
        )
        _show_change(change)
        return
    corpus = _corpus(corpus_tenant, corpus_job, corpus_since, corpus_until)
    maker = _maker(name, version)
    change, started = _run(
        lambda conn: reembed.promote(conn, name, version, _actor(), corpus, maker)
    )
    _show_change(change)
    _publish(started)


@app.command()
def migrate(
    ref: str = typer.Argument(..., help="name@version, the live version"),
    corpus_tenant: str = typer.Option(..., "--corpus-tenant", help="whose corpus"),
    corpus_job: str | None = _JOB,
    corpus_since: str | None = _SINCE,
    corpus_until: str | None = _UNTIL,
) -> None:
    """Re-embed another tenant's corpus with the live version (after its promote)."""
    from results import reembed

    name, version = _versioned(ref)
    corpus = _corpus(corpus_tenant, corpus_job, corpus_since, corpus_until)
    maker = _maker(name, version)
    started = _run(lambda conn: reembed.migrate(conn, name, version, _actor(), corpus, maker))
    _publish(started)


@app.command()
def migrations(name: str | None = typer.Argument(None, help="one model; default: all")) -> None:
    """Re-embeds of corpora, newest first, with their coverage by the new version."""
    from results import reembed

    listed = _run(lambda conn: reembed.list_migrations(conn, name))
    if not listed:
        typer.echo("no migrations" + (f" of {name}" if name else ""))
        return
    typer.echo(f"{'job':<38}{'model':<28}{'tenant':<20}{'items':>9}{'coverage':>10}  state")
    for m in listed:
        v = m.view()
        move = f"{m.name}@{m.from_version}->{m.to_version}"
        typer.echo(
            f"{m.job_id:<38}{move:<28}{m.tenant:<20}{m.total:>9}{m.coverage:>10.1%}  {v['state']}"
        )


def _corpus(tenant: str, job: str | None, since: str | None, until: str | None) -> Any:
    from datetime import UTC, datetime

    from core.errors import GristmillError
    from core.models.reembed import corpus_of

    def when(raw: str | None, flag: str) -> datetime | None:
        if raw is None:
            return None
        try:
            return datetime.fromisoformat(raw)
        except ValueError:
            _fail(f"{flag} is not an ISO time: {raw}")

    try:
        return corpus_of(
            tenant,
            job_id=job,
            since=when(since, "--corpus-since"),
            until=when(until, "--corpus-until"),
            now=datetime.now(UTC),
        )
    except GristmillError as exc:
        _fail(exc.message)


def _maker(name: str, version: str) -> Any:
    from ingest.jobs.incremental import reembed_maker

    return reembed_maker(load_settings(), name, version)


def _publish(started: Any) -> None:
    """The migration job's items into Kafka (as the API does); should this fail, the
    job stays ``submitting`` and an API instance finishes it (decision 10)."""
    from ingest.jobs.publisher import JobPublisher

    typer.echo(
        f"re-embedding {started.total} items of tenant {started.tenant}'s corpus with "
        f"{started.name}@{started.to_version}: job {started.job_id}"
    )
    publisher = JobPublisher(load_settings())
    try:
        publisher.publish_sync(started.job_id)
    except Exception as exc:  # Kafka away: recorded, an API instance will produce it
        typer.secho(f"not in Kafka yet ({exc}); an API instance will finish it", fg="yellow")
    finally:
        publisher.close()


@app.command()
def rollback(
    ref: str = typer.Argument(..., help="name (the live version) or name@version (a canary)"),
) -> None:
    """Put the previous live version back, or withdraw a canary."""
    from core.models import lifecycle
    from core.models.registry import parse_ref

    name, version = parse_ref(ref)
    _apply(name, lambda m: lifecycle.rollback(m, version or None))


@app.command()
def retire(ref: str = typer.Argument(..., help="name@version")) -> None:
    """Stop serving a version: its queued requests finish, then workers unload it."""
    from results import reembed

    name, version = _versioned(ref)
    # Refused while a corpus is still being re-embedded away from it (decision 68).
    change = _run(lambda conn: reembed.retire(conn, name, version, _actor()))
    _show_change(change)


@app.command()
def sticky(
    name: str,
    by: str = typer.Argument(..., help="tenant or idempotency_key"),
) -> None:
    """What keeps a caller on one side of a canary: its tenant (default) or its
    Idempotency-Key."""
    from results import modelregistry

    if by not in ("tenant", "idempotency_key"):
        _fail("sticky is tenant or idempotency_key")
    _run(lambda conn: modelregistry.set_sticky(conn, name, by, _actor()))
    typer.echo(f"{name}: canary assignment sticky per {by}")


@app.command()
def audit(name: str | None = typer.Argument(None), limit: int = typer.Option(30, min=1)) -> None:
    """Who changed what, and when."""
    from results import modelregistry

    rows = _run(lambda conn: modelregistry.audit_log(conn, name, limit))
    for r in reversed(rows):
        ref = r["name"] + (f"@{r['version']}" if r["version"] else "")
        detail = json.dumps(r["detail"], sort_keys=True)
        typer.echo(f"{r['at']:%Y-%m-%d %H:%M:%S}  {r['action']:<9}{ref:<28}{r['actor']}  {detail}")


@app.command()
def replay(
    candidate: str = typer.Option(..., help="name@version to try"),
    since: str = typer.Option("1h", help="recorded traffic of the last 90s, 15m, 1h, 2d"),
    limit: int = typer.Option(2000, min=1, help="most recent requests to replay"),
    baseline: str = typer.Option("", help="only requests answered by this version"),
    timeout: float = typer.Option(600.0, help="seconds to wait for the candidate's answers"),
    compare_by: str = typer.Option("auto", help="auto, exact, cosine or text"),
    min_agreement: float = typer.Option(0.99, help="share of requests that must agree"),
    min_cosine: float = typer.Option(0.99, help="cosine at which two embeddings agree"),
    max_error_delta: float = typer.Option(0.01, help="extra error rate allowed"),
    chart: Path | None = typer.Option(None, help="write a PNG chart here"),
    out: Path | None = typer.Option(None, help="write the report as JSON here"),
) -> None:
    """Re-run recorded requests against a candidate at background priority; compare."""
    from tqdm import tqdm

    from core.errors import GristmillError
    from gristmill.replay import parse_since, run_replay, write_chart
    from gristmill.replay_report import MODES, Thresholds, render

    if compare_by not in MODES:
        _fail("--compare-by is auto, exact, cosine or text")
    settings = load_settings()
    bar: Any = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc="replayed", unit="req")
        bar.n = done
        bar.refresh()

    try:
        outcome = run_replay(
            settings,
            _engine(),
            candidate=candidate,
            since=parse_since(since),
            actor=_actor(),
            limit=limit,
            baseline=baseline,
            timeout_s=timeout,
            thresholds=Thresholds(min_agreement, min_cosine, max_error_delta),
            mode=compare_by,
            progress=progress,
        )
    except GristmillError as exc:
        _fail(exc.message)
    finally:
        if bar is not None:
            bar.close()
    name = candidate.partition("@")[0]
    typer.echo(render(outcome.report, name, candidate))
    typer.echo(f"replay {outcome.replay_id} recorded with the registry")
    if chart is not None:
        write_chart(outcome.report, chart, f"replay of {name} against {candidate}")
        typer.echo(f"chart: {chart}")
    if out is not None:
        out.write_text(json.dumps(_clean(outcome.report.as_dict()), indent=1) + "\n")
    if not outcome.report.passed:
        raise typer.Exit(2)


@app.command("export-embedding")
def export_embedding(
    out: Path = typer.Argument(..., help="a new directory"),
    dtype: str = typer.Option("fp16", help="fp16, bf16 or fp32"),
) -> None:
    """Write the packaged embedding weights in another precision: a second real version
    of all-minilm-l6-v2 with its own sha256 (docs/models.md)."""
    from workers.models.embedding.export import export

    try:
        digest = export(out, dtype=dtype)
    except (ValueError, FileExistsError) as exc:
        _fail(str(exc))
    typer.echo(f"wrote {out} (sha256 {digest})")
    typer.echo(
        f"register it: gristmill models register all-minilm-l6-v2@2 --backend embedding "
        f"--artifact {out} --max-batch 256"
    )


def _versioned(ref: str) -> tuple[str, str]:
    from core.models.registry import parse_ref

    name, version = parse_ref(ref)
    if not version:
        _fail(f"name the version: {name}@VERSION")
    return name, version


def _clean(x: Any) -> Any:
    """NaN (no samples) as null: JSON has no NaN."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x
