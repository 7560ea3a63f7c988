"""What every client was told: one record per request sent (and per job submitted).

The audit compares this ledger with PostgreSQL. It is also written to disk as
JSON lines so anyone can audit a run independently.
"""

from __future__ import annotations

import re
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

CONN_ERROR = 0  # no HTTP answer at all (refused, reset, client timeout)

_RID = re.compile(r"/v1/requests/([0-9a-f-]{36})")


@dataclass
class Outcome:
    seq: int
    api: int  # index of the API instance it was sent to
    tier: str
    input: str
    salt: str
    sent_at: float  # epoch seconds
    done_at: float = 0.0
    status: int = CONN_ERROR
    request_id: str | None = None
    output: Any = None
    error: str | None = None
    retry_after: str | None = None

    @property
    def accepted(self) -> bool:
        """200, or 504 (the API had it durable in Kafka before the deadline passed)."""
        return self.status in (200, 504)

    def read_answer(
        self, status: int, body: dict[str, Any] | None, retry_after: str | None
    ) -> None:
        self.status = status
        self.retry_after = retry_after
        if body is None:
            return
        if status == 200:
            self.request_id = body.get("request_id")
            self.output = body.get("output")
            return
        err = body.get("error") or {}
        self.error = str(err.get("message", ""))[:300]
        m = _RID.search(self.error)
        if m:  # a 504 names the request id to fetch later
            self.request_id = m.group(1)


@dataclass
class JobOutcome:
    seq: int
    api: int
    tier: str
    salt: str
    inputs: list[str]
    sent_at: float
    done_at: float = 0.0
    status: int = CONN_ERROR
    job_id: str | None = None
    error: str | None = None

    @property
    def accepted(self) -> bool:
        return self.status == 202


@dataclass
class Ledger:
    outcomes: list[Outcome] = field(default_factory=list)
    jobs: list[JobOutcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, o: Outcome) -> None:
        with self.lock:
            self.outcomes.append(o)

    def add_job(self, j: JobOutcome) -> None:
        with self.lock:
            self.jobs.append(j)

    def snapshot(self) -> list[Outcome]:
        with self.lock:
            return list(self.outcomes)

    def write(self, path: Path) -> None:
        with self.lock, path.open("wb") as f:
            for o in self.outcomes:
                f.write(orjson.dumps({"type": "request", **asdict(o)}) + b"\n")
            for j in self.jobs:
                f.write(orjson.dumps({"type": "job", **asdict(j)}) + b"\n")
