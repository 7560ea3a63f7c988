"""One settings object, read once at process start and passed down.

Every knob has a default that works for local development. Deployments set
``KAFKA_BOOTSTRAP`` and ``DATABASE_URL`` (unprefixed, as most platforms inject
them) and ``GRISTMILL_*`` for the rest. No other module reads the environment.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import get_origin

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GRISTMILL_", extra="ignore", validate_by_name=True, validate_by_alias=True
    )

    # --- where the services are ---
    kafka_bootstrap: str = Field(
        "127.0.0.1:9092",
        validation_alias=AliasChoices("KAFKA_BOOTSTRAP", "GRISTMILL_KAFKA_BOOTSTRAP"),
    )
    database_url: str = Field(
        "postgresql+psycopg://gristmill@127.0.0.1:5432/gristmill",
        validation_alias=AliasChoices("DATABASE_URL", "GRISTMILL_DATABASE_URL"),
    )
    topic_prefix: str = "gristmill"
    topic_partitions: int = 6
    topic_replication: int = 1

    # --- ingest ---
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    # uvicorn processes `gristmill dev`, `gristmill api` and the peer benchmark start: one
    # event loop saturates a core near 1,000 req/s (docs/bench/README.md).
    api_processes: int = 2
    max_body_bytes: int = 1_000_000
    max_input_chars: int = 20_000
    # A request's deadline when the caller gives no timeout_ms: its tier's SLO (tiers
    # not listed: default_timeout_ms). Past it the caller gets 504 and compute is skipped.
    tier_slo_ms: dict[str, int] = {"enterprise": 1_000, "paid": 2_000, "free": 5_000}
    default_timeout_ms: int = 10_000
    max_timeout_ms: int = 300_000
    # Kafka must have the message within this long, else the API answers 503.
    produce_timeout_ms: int = 5_000
    # How long an API key lookup is cached; revocation takes effect within it.
    auth_cache_s: float = 10.0
    # Fallback poll of the result store when a NOTIFY may have been missed.
    result_poll_interval_ms: int = 500
    idempotency_ttl_h: int = 24

    # --- tiers: rate limits per tenant (requests/s and burst; job items/s) ---
    tier_rate_rps: dict[str, float] = {"free": 20.0, "paid": 200.0, "enterprise": 2000.0}
    tier_burst: dict[str, float] = {"free": 40.0, "paid": 400.0, "enterprise": 4000.0}
    tier_job_items_per_s: dict[str, float] = {
        "free": 5_000.0,
        "paid": 50_000.0,
        "enterprise": 500_000.0,
    }
    # --- admission: shed a class when its predicted queue delay exceeds this (ms) ---
    # Rising with the tier, each below its SLO less a batch's compute and linger, and set
    # from the latency an admitted request should keep at saturation: at 450 ms enterprise
    # requests kept p95 < 500 ms at the workers' full capacity (decision 8).
    shed_delay_ms: dict[str, float] = {"free": 250.0, "paid": 400.0, "enterprise": 450.0}
    target_utilization: float = 0.75
    # Requests one API instance holds at once, and the share of that each tier may use.
    max_inflight: int = 1000
    # Event-loop lag (ms) at which an API instance starts refusing a tier's new sync
    # requests, and at which it refuses them all (ingest/overload.py): its own CPU
    # saturation, which the workers' load reports cannot show.
    loop_lag_shed_ms: dict[str, tuple[float, float]] = {
        "free": (50.0, 150.0),
        "paid": (75.0, 200.0),
        "enterprise": (100.0, 300.0),
    }
    # The same for the smoothed time from a sync result's commit to its answer (ms).
    answer_delay_shed_ms: dict[str, tuple[float, float]] = {
        "free": (50.0, 150.0),
        "paid": (75.0, 200.0),
        "enterprise": (100.0, 250.0),
    }
    inflight_share: dict[str, float] = {"free": 0.5, "paid": 0.8, "enterprise": 1.0}
    # API instances and schedulers report every second; older reports are ignored.
    load_report_stale_s: float = 5.0

    # --- jobs ---
    max_job_items: int = 1_000_000  # per job, JSONL upload
    max_job_json_items: int = 100_000  # per job, JSON body
    max_job_bytes: int = 1_073_741_824  # 1 GB upload
    default_completion_window_s: int = 86_400
    max_completion_window_s: int = 7 * 86_400
    # A job still 'submitting' without a heartbeat for this long is finished by another API.
    submit_stale_s: float = 30.0
    webhook_max_attempts: int = 8
    webhook_timeout_s: float = 10.0

    # --- scheduler ---
    consumer_group: str = "gristmill-scheduler"
    # Upper bound on how long a request may wait for companions (milliseconds).
    max_linger_ms: int = 50
    # Safety margin kept between predicted completion and the deadline (ms).
    deadline_margin_ms: int = 20
    # Longest compute a batch may take (ms); 0: derived from the tightest tier SLO, so
    # that a sync request can wait out one running batch and then run its own:
    # (min SLO - max linger - margin) / 2. The scheduler picks, from each worker's
    # warmup curve, the batch size with the most items/s within it.
    batch_budget_ms: float = 0.0
    # Buffered requests above which Kafka partitions are paused (backpressure).
    max_buffered: int = 20_000
    # A batch that takes longer than this is treated as a hung worker (seconds).
    batch_timeout_s: float = 60.0
    commit_interval_ms: int = 100
    workers: int = 2

    def batch_budget(self) -> float:
        """``batch_budget_ms``, or the one the tightest tier SLO implies."""
        if self.batch_budget_ms > 0:
            return self.batch_budget_ms
        slo = min(self.tier_slo_ms.values(), default=self.default_timeout_ms)
        return max(1.0, (slo - self.max_linger_ms - self.deadline_margin_ms) / 2)

    # Comma-separated models each local worker serves, e.g. "sim,embed".
    worker_models: str = "sim"
    worker_socket: str = ""

    # --- models ---
    sim_batch_ms: float = 100.0
    sim_max_batch: int = 100
    # Test-only: inputs starting with this prefix + crash/hang/error make sim misbehave.
    sim_poison_prefix: str = ""
    embed_device: str = "auto"
    embed_max_batch: int = 256
    embed_max_tokens: int = 256


def load_settings() -> Settings:
    return Settings()


def settings_from_env(env: Mapping[str, str]) -> Settings:
    """The settings a process started with environment ``env`` would read."""
    values: dict[str, object] = {}
    for name, f in Settings.model_fields.items():
        keys = [f"GRISTMILL_{name.upper()}"]
        if isinstance(f.validation_alias, AliasChoices):
            keys = [str(k) for k in f.validation_alias.choices] + keys
        for k in keys:
            if k in env:
                # Complex fields come as JSON, as pydantic-settings reads them in the
                # process itself (GRISTMILL_SHED_DELAY_MS='{"free": 250, ...}').
                complex_ = get_origin(f.annotation) in (dict, list)
                values[name] = json.loads(env[k]) if complex_ else env[k]
                break
    return Settings.model_validate({**values}, by_name=True)
