"""A tenant's OpenAI files on a budget (decision 42).

The bytes live in PostgreSQL (results/files.py), beside everything else, so what one
tenant may keep there is bounded: bytes and files (``tier_file_bytes``,
``tier_file_count``), uploads started per minute (``tier_file_uploads_per_min``), a life
(OpenAI's ``expires_after``, else ``file_default_expiry_s``; the sweeper deletes a file
past it), and a batch input file must be JSONL, every line a JSON object, before any of
it is stored. The decisions here are pure (usage, settings and the clock come in); the
storage's own check runs again under the tenant's lock when the file is stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import IO, Any

import orjson

from core.config import Settings
from core.errors import InvalidInput, QuotaExceeded
from core.limits import ascii_decimal
from ingest.admission.policy import enforce
from ingest.admission.ratelimit import TenantLimiter
from ingest.jobs.upload import LineSplitter
from ingest.openai.batch_wire import MAX_OUTPUT_EXPIRY_S, MIN_OUTPUT_EXPIRY_S
from results.files import FileUsage
from results.tenants import Tenant

# Multipart framing around a file's bytes (boundaries, part headers, the other fields):
# what an upload may carry past the room left for the file itself.
MULTIPART_SLACK = 64 << 10
_READ = 1 << 20  # bytes of a staged file read at a time while checking it
ANCHOR, SECONDS = "expires_after[anchor]", "expires_after[seconds]"


@dataclass(frozen=True)
class Budget:
    max_bytes: int
    max_files: int

    @classmethod
    def of(cls, settings: Settings, tier: str) -> Budget:
        return cls(settings.tier_file_bytes[tier], settings.tier_file_count[tier])

    def room(self, usage: FileUsage) -> int:
        """Bytes the tenant may still store."""
        return max(0, self.max_bytes - usage.bytes)

    def check(self, usage: FileUsage, size: int = 0) -> None:
        """403 unless one more file of ``size`` bytes fits beside ``usage``."""
        if usage.files >= self.max_files:
            raise QuotaExceeded(
                f"this tenant keeps {usage.files} files, its plan's limit; delete some "
                "or let them expire",
                field="file",
            )
        if usage.bytes + size > self.max_bytes:
            raise QuotaExceeded(
                f"this file does not fit: {usage.bytes} of the plan's {self.max_bytes} "
                f"bytes are stored ({self.room(usage)} free); delete files or let them expire",
                field="file",
            )


def check_upload_rate(
    limiter: TenantLimiter, settings: Settings, tenant: Tenant, now: float
) -> dict[str, str]:
    """One upload against the tenant's file bucket (a minute's worth of burst); 429
    with Retry-After past it. Returns RateLimit-* headers."""
    per_min = settings.tier_file_uploads_per_min[tenant.tier]
    v = limiter.check(tenant.id, "files", rate=per_min / 60, burst=per_min, n=1, now=now)
    return enforce(v, f"this key may start {per_min:g} file uploads a minute")


def expiry(anchor: Any, seconds: Any, now: datetime, default_s: int) -> datetime:
    """OpenAI's ``expires_after`` as the form fields its SDK sends
    (``expires_after[anchor]=created_at``, ``expires_after[seconds]=N``, N from an hour
    to 30 days); without them, ``default_s`` from now."""
    if anchor is None and seconds is None:
        return now + timedelta(seconds=default_s)
    if anchor != "created_at":
        raise InvalidInput(f"{ANCHOR} must be 'created_at'", field=ANCHOR)
    n = ascii_decimal(seconds) if isinstance(seconds, str) else None
    if n is None or not MIN_OUTPUT_EXPIRY_S <= n <= MAX_OUTPUT_EXPIRY_S:
        raise InvalidInput(
            f"{SECONDS} must be an integer from {MIN_OUTPUT_EXPIRY_S} to {MAX_OUTPUT_EXPIRY_S}",
            field=SECONDS,
        )
    return now + timedelta(seconds=n)


def check_jsonl(f: IO[bytes], max_line: int) -> int:
    """A batch input file, staged: every line a JSON object (blank lines aside), none
    longer than ``max_line``; else a 400 (413 for a long line) naming the first bad
    line, before anything is stored. Returns the number of objects. Reads the file
    ``_READ`` bytes at a time (run it off the event loop)."""
    splitter, n = LineSplitter(max_line), 0

    def one(line: bytes, number: int) -> int:
        if not line.strip():
            return 0
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            raise InvalidInput(
                f"line {number} is not a JSON object: a batch input file is JSONL, one "
                "request object a line",
                field="file",
            )
        return 1

    f.seek(0)
    while chunk := f.read(_READ):
        first = splitter.lines + 1
        for i, line in enumerate(splitter.feed(chunk), start=first):
            n += one(line, i)
    last = splitter.finish()
    if last is not None:
        n += one(last, splitter.lines)
    if n == 0:
        raise InvalidInput("the file holds no JSON lines", field="file")
    f.seek(0)
    return n
