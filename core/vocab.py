"""The words the stages share: tiers, priority classes, statuses, model references.

StrEnums compare equal to their string values, so they travel unchanged through
Kafka messages, JSON bodies and PostgreSQL text columns; code compares against the
enum instead of a bare string so a typo is a name error, not a silent mismatch.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class Tier(StrEnum):
    """A tenant's tier (results/schema.py ``tenants.tier``), lowest first."""

    FREE = "free"
    PAID = "paid"
    ENTERPRISE = "enterprise"


TIERS: tuple[Tier, ...] = tuple(Tier)  # lowest first: free, paid, enterprise


class PriorityClass(StrEnum):
    """The class a request is queued and consumed in; one Kafka topic each
    (decision 2). Declared most urgent first: ``rank`` is the position."""

    ENTERPRISE = "enterprise"
    PAID = "paid"
    FREE = "free"
    JOBS = "jobs"  # job items: backfill in what sync traffic leaves (decision 11)

    @property
    def rank(self) -> int:
        """0 for the most urgent class."""
        return PRIORITY_CLASSES.index(self)


class ServiceTier(StrEnum):
    """What a request asks to be served as (``service_tier``, decision 66): ``flex``
    waits in Kafka behind every sync tier at job items' priority and is never refused
    for capacity; ``default`` is the key's tier; ``priority`` the highest tier the key
    may use."""

    FLEX = "flex"
    DEFAULT = "default"
    PRIORITY = "priority"


# Most urgent first; the index is the class's rank.
PRIORITY_CLASSES: tuple[PriorityClass, ...] = tuple(PriorityClass)
TIER_TO_CLASS: dict[str, PriorityClass] = {
    Tier.ENTERPRISE: PriorityClass.ENTERPRISE,
    Tier.PAID: PriorityClass.PAID,
    Tier.FREE: PriorityClass.FREE,
}


class RequestStatus(StrEnum):
    """A request row's outcome (results/schema.py ``requests.status``)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    EXPIRED = "expired"  # its deadline passed before it ran: not computed
    CANCELLED = "cancelled"  # its job was cancelled before it ran


class ItemStatus(StrEnum):
    """A job item as the job API shows it: its request's outcome, or still queued."""

    QUEUED = "queued"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class JobStatus(StrEnum):
    """A job's status, derived from its counters and times (results/jobs.py)."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def finished(self) -> bool:
        return self in FINISHED_JOB_STATUSES


FINISHED_JOB_STATUSES = frozenset(
    {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED}
)


class ModelRef(NamedTuple):
    """One version of one model. A tuple, so ``(name, version)`` pairs compare and
    hash equal to it."""

    model: str
    version: str

    def label(self) -> str:
        """``name@version``, as load reports and logs write it."""
        return f"{self.model}@{self.version}"
