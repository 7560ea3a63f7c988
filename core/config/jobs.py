"""Client batches, stored files and how long the request log keeps what."""

from __future__ import annotations

import ipaddress
from typing import Self

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from core.config._base import (
    AtLeastOne,
    PositiveFloat,
    _check_not_above,
    _check_tier_order,
    _Concern,
)


class JobSettings(_Concern):
    """Client batches (ingest/jobs/routes.py, ingest/jobs/submit.py, ingest/jobs/webhooks.py)."""

    max_job_items: int = Field(1_000_000, ge=1)  # per job, JSONL upload
    max_job_json_items: int = Field(100_000, ge=1)  # per job, JSON body
    max_job_bytes: int = Field(1_073_741_824, ge=1)  # 1 GB upload
    default_completion_window_s: int = Field(86_400, gt=0)
    max_completion_window_s: int = Field(7 * 86_400, gt=0)
    # A JSON job body is parsed whole in memory, so it is capped far below a JSONL upload,
    # which is staged on disk line by line (decision 26).
    max_job_json_bytes: int = Field(16_777_216, ge=1)
    # Uploads (JSON or JSONL) one API instance stages at once, and one tenant of them:
    # each holds a temp file of up to max_job_bytes and one line in memory (decision 26).
    max_uploads: int = Field(8, ge=1)
    max_uploads_per_tenant: int = Field(2, ge=1)
    # True: jobs' items are put in Kafka by a child process of each API process, at a
    # lower CPU priority than the sync requests it serves (decision 74); false: by
    # threads of the API process itself, paced by its event loop's lag
    # (ingest/jobs/pacing.py). Off: on a GPU host the sync answers beside a job were no
    # faster with it (r16), and on the 2-core box a fresh system's first seconds slower.
    job_publish_process: bool = False
    # An upload whose client sends nothing for this long is answered 408 (seconds), and
    # so is one that, past that time, averages under upload_min_bytes_per_s (a trickle
    # holding a slot; 16 KiB/s is a poor mobile link).
    upload_idle_timeout_s: float = Field(30.0, gt=0)
    upload_min_bytes_per_s: float = Field(16_384.0, ge=0)
    # Folder for staged uploads; "" is the system's temp folder.
    upload_dir: str = ""
    # follow=true result streams one tenant may hold open on one instance, and in all.
    max_follow_streams: int = Field(200, ge=1)
    max_follow_streams_per_tenant: int = Field(4, ge=1)
    # A job still 'submitting' without a heartbeat for this long is finished by another API.
    submit_stale_s: float = Field(30.0, gt=0)
    webhook_max_attempts: int = Field(8, ge=1)
    # The whole delivery (resolve, connect, TLS, send, read the answer) has this long.
    webhook_timeout_s: float = Field(10.0, gt=0)
    # Networks webhooks may reach although they are internal (loopback, private...):
    # CIDRs, e.g. ["127.0.0.0/8", "::1/128"] for local development (decision 27).
    webhook_allow_networks: list[str] = []

    @field_validator("webhook_allow_networks")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        for cidr in value:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError as exc:
                raise ValueError(f"webhook_allow_networks: {cidr!r} is not a network") from exc
        return value

    @model_validator(mode="after")
    def _job_limits(self) -> Self:
        _check_not_above(
            self,
            ("max_uploads_per_tenant", "max_uploads"),
            ("max_follow_streams_per_tenant", "max_follow_streams"),
            ("max_job_json_bytes", "max_job_bytes"),
            ("default_completion_window_s", "max_completion_window_s"),
            ("max_job_json_items", "max_job_items"),
        )
        return self


class FileSettings(_Concern):
    """OpenAI's Files on a budget (ingest/openai/file_budget.py, decision 42): the bytes live in
    PostgreSQL, so what one tenant may keep there is bounded by its tier."""

    # Bytes of unexpired files a tenant may keep, and how many files.
    tier_file_bytes: dict[str, AtLeastOne] = {
        "free": 100_000_000,
        "paid": 10_000_000_000,
        "enterprise": 100_000_000_000,
    }
    tier_file_count: dict[str, AtLeastOne] = {"free": 100, "paid": 1_000, "enterprise": 10_000}
    # Uploads a tenant may start per minute (a minute's worth at once).
    tier_file_uploads_per_min: dict[str, PositiveFloat] = {
        "free": 10.0,
        "paid": 60.0,
        "enterprise": 600.0,
    }
    # A file's life when its upload names none (s): OpenAI's for purpose=batch, 30 days.
    file_default_expiry_s: int = Field(30 * 86_400, ge=3_600, le=30 * 86_400)

    @model_validator(mode="after")
    def _file_tiers_in_order(self) -> Self:
        _check_tier_order("tier_file_bytes", self.tier_file_bytes, rises=True)
        _check_tier_order("tier_file_count", self.tier_file_count, rises=True)
        _check_tier_order("tier_file_uploads_per_min", self.tier_file_uploads_per_min, rises=True)
        return self


class RetentionSettings(_Concern):
    """How long the request log keeps what, and how it is cut (results/retention.py,
    results/sweeper.py; docs/decisions/0029-compact-results-and-a-partitioned-request-log.md)."""

    # Days a request's row stays in the log (a tenant's log_retention_days overrides it).
    request_log_retention_days: int = Field(30, ge=1, le=3650)
    # Width of one time partition of the log tables (hours; whole days name them by day).
    request_log_partition_hours: int = Field(24, ge=1, le=24 * 31)
    # Partitions are made this far ahead of now (hours): the sweep may stop this long
    # (every process down, or the leader stuck) before a row finds no partition.
    request_log_ahead_hours: int = Field(72, ge=1)
    # The sweeper's pass: how often (seconds), and the rows one DELETE takes (short
    # transactions that never hold a writer up; docs/bench/store.md measures them).
    sweep_interval_s: float = Field(60.0, gt=0)
    sweep_batch_rows: int = Field(5_000, ge=1)
    # Time one pass may spend deleting before it yields to the next (seconds).
    sweep_budget_s: float = Field(20.0, gt=0)
    # Bounds of a job's output_expires_after (seconds), as OpenAI's batches: 1 h..30 d.
    min_output_expires_s: int = Field(3_600, ge=1)
    max_output_expires_s: int = Field(30 * 86_400, ge=1)

    @model_validator(mode="after")
    def _ahead(self) -> Self:
        if self.request_log_ahead_hours < self.request_log_partition_hours:
            raise ValueError(
                f"request_log_ahead_hours ({self.request_log_ahead_hours}) must be at least "
                f"request_log_partition_hours ({self.request_log_partition_hours})"
            )
        _check_not_above(self, ("min_output_expires_s", "max_output_expires_s"))
        return self
