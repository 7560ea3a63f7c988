"""Re-embedding a corpus when an embedding model changes (decision 68), the pure parts:
what names a corpus, how much of it a new version has embedded (coverage), and the two
gates - a migration starts only after a passing replay, and a version that a corpus is
still being migrated away from is not retired.

Vectors of two versions cannot be compared, so a corpus moves whole: one migration job
per corpus, pinned to the new version (every output of it from that version), while
reads pinned to the old version keep answering until coverage is complete.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from core.errors import Conflict, InvalidInput

CORPUS_JOB = "job"  # a finished job's items, in its order, with its custom ids
CORPUS_LOG = "log"  # the distinct inputs of a tenant's sync requests in a time window


@dataclass(frozen=True)
class Corpus:
    """A tenant's corpus: the items of one of its jobs, or its request log for a window
    (its sync requests of the model that succeeded, each distinct input once)."""

    tenant: str  # the tenant's name: the migration job is that tenant's
    job_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    @property
    def kind(self) -> str:
        return CORPUS_JOB if self.job_id is not None else CORPUS_LOG

    def described(self) -> dict[str, Any]:
        if self.job_id is not None:
            return {"kind": CORPUS_JOB, "tenant": self.tenant, "job_id": self.job_id}
        assert self.since is not None and self.until is not None
        return {
            "kind": CORPUS_LOG,
            "tenant": self.tenant,
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
        }


def corpus_of(
    tenant: str,
    *,
    job_id: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    now: datetime,
    field: str = "corpus",
) -> Corpus:
    """A corpus from what an operator named, or the 400 naming the field: a tenant and
    either a job or a window (``until`` defaults to ``now``; times carry a zone)."""
    if not tenant:
        raise InvalidInput("a corpus names its tenant", field=f"{field}.tenant")
    if (job_id is None) == (since is None):
        raise InvalidInput(
            "a corpus is a job (job_id) or a window of the request log (since, until)",
            field=field,
        )
    if job_id is not None:
        if until is not None:
            raise InvalidInput("until belongs to a window, not a job", field=f"{field}.until")
        return Corpus(tenant, job_id=job_id)
    assert since is not None
    end = now if until is None else until
    for name, t in (("since", since), ("until", end)):
        if t.tzinfo is None:
            raise InvalidInput(f"{name} needs a time zone (e.g. Z)", field=f"{field}.{name}")
    if end <= since:
        raise InvalidInput("until must be after since", field=f"{field}.until")
    return Corpus(tenant, since=since, until=end)


def coverage(covered: int, total: int) -> float:
    """The share of a corpus the new version has embedded; an empty corpus is covered."""
    return 1.0 if total <= 0 else min(1.0, covered / total)


@dataclass(frozen=True)
class Migration:
    """One corpus moving from one version to another: its job, and how far it is."""

    job_id: str
    name: str
    from_version: str
    to_version: str
    tenant: str
    corpus: dict[str, Any]
    total: int
    succeeded: int  # items whose result from ``to_version`` is stored
    cancelled: bool  # the job was cancelled: the migration is abandoned
    created_at: datetime | None = None

    @property
    def coverage(self) -> float:
        return coverage(self.succeeded, self.total)

    @property
    def complete(self) -> bool:
        return self.total > 0 and self.succeeded >= self.total

    @property
    def pending(self) -> bool:
        """Still under way: readers of the corpus need its old version."""
        return not self.complete and not self.cancelled

    def view(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "model": self.name,
            "from_version": self.from_version,
            "to_version": self.to_version,
            "tenant": self.tenant,
            "corpus": self.corpus,
            "items": self.total,
            "covered": self.succeeded,
            "coverage": round(self.coverage, 6),
            "state": "complete" if self.complete else "cancelled" if self.cancelled else "running",
            "created_at": self.created_at.isoformat() if self.created_at else None,
        }


def check_gate(name: str, version: str, replay_passed: bool) -> None:
    """A migration starts only once a replay of recorded traffic passed against the
    version (its error rate and latency: agreement with the old vectors means nothing
    for a model in a new vector space, so such a replay runs with --min-agreement 0)."""
    if not replay_passed:
        raise Conflict(
            f"{name}@{version} has no passing replay, and a re-embed starts only after one: "
            f"run `gristmill models replay --candidate {name}@{version}` first"
        )


def check_source(
    name: str, version: str, source_model: str, source_version: str, what: str
) -> None:
    """A corpus job must be of the model, and not of the version it moves to."""
    if source_model != name:
        raise InvalidInput(
            f"{what} ran {source_model}, not {name}: a corpus is re-embedded by its own model",
            field="corpus.job_id",
        )
    if source_version == version:
        raise InvalidInput(
            f"{what} already ran {name}@{version}: nothing to re-embed", field="corpus.job_id"
        )


def check_retire(name: str, version: str, migrations: Iterable[Migration]) -> None:
    """Refuse to retire a version while a corpus is still moving away from it (callers
    pin it to read a corpus whose new vectors are not all there yet), or onto it (its
    migration job's items would find it gone)."""
    for m in migrations:
        if m.name != name or not m.pending:
            continue
        if m.from_version == version:
            raise Conflict(
                f"{name}@{version} is still read while job {m.job_id} re-embeds tenant "
                f"{m.tenant}'s corpus to @{m.to_version} ({m.coverage:.1%} covered); retire "
                "it once coverage is 100%, or cancel that job to abandon the migration"
            )
        if m.to_version == version:
            raise Conflict(
                f"job {m.job_id} is re-embedding tenant {m.tenant}'s corpus with "
                f"{name}@{version} ({m.coverage:.1%} covered); cancel that job first"
            )


def version_coverage(migrations: Iterable[Migration]) -> dict[tuple[str, str], float]:
    """Coverage per (model, new version) over its migrations not cancelled: the share
    of all their corpora's items embedded by the new version."""
    covered: dict[tuple[str, str], list[int]] = {}
    for m in migrations:
        if m.cancelled:
            continue
        c = covered.setdefault((m.name, m.to_version), [0, 0])
        c[0] += min(m.succeeded, m.total)
        c[1] += m.total
    return {k: coverage(s, t) for k, (s, t) in covered.items()}
