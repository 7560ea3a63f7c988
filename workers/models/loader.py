"""Turn a model version (a registry record, core/models/registry.py) and the worker's
runtime settings (how it runs: device, precision, graphs) into a loaded, verified and
warmed-up ``Model``.

Verification comes first: a record that pins a sha256 has its artifact hashed
(core/models/artifact.py) before any of it is loaded; a mismatch raises
``ArtifactError`` naming both digests and the version never serves.

Called in the worker process only: loading the embedding model imports torch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from core.config import Settings
from core.models.artifact import ArtifactError, verify
from core.models.catalog import build_specs
from core.models.causal_lm import CausalLMSpec
from core.models.embedding import EmbedSpec
from core.models.http import HttpSpec
from core.models.registry import VersionRecord, builtin_records, spec_from_record
from core.models.sim import SimSpec
from core.models.spec import ModelSpec
from core.protocol import ModelInfo
from core.vocab import ModelRef
from workers.models.base import Model
from workers.models.sim import SimModel

log = logging.getLogger(__name__)


def load_model(spec: ModelSpec, settings: Settings) -> Model:
    """Load weights and return a ready model: the worker runtime's knobs
    (``WorkerSettings``) and where the weights are (the spec's artifact, else
    ``embed_model_dir``)."""
    if isinstance(spec, SimSpec):
        return SimModel(spec, poison_prefix=settings.sim_poison_prefix)
    if isinstance(spec, EmbedSpec):
        from workers.models.embedding.runtime import EmbeddingModel, EmbedRuntime

        return EmbeddingModel(
            spec,
            EmbedRuntime(
                device=settings.embed_device,
                dtype=settings.embed_dtype,
                bucket_tokens=settings.embed_bucket_tokens,
                cuda_graphs=settings.embed_cuda_graphs,
                model_dir=settings.embed_model_dir,
                tokenize_processes=settings.embed_tokenize_processes,
            ),
        )
    if isinstance(spec, HttpSpec):
        from workers.models.breaker import Breaker
        from workers.models.http_backend import HttpModel

        return HttpModel(
            spec,
            attempts=settings.http_attempts,
            breaker=Breaker(settings.http_breaker_failures, settings.http_breaker_open_s),
        )
    if isinstance(spec, CausalLMSpec):
        from workers.models.causal_lm.serving import CausalLMModel

        return CausalLMModel(
            spec,
            device=settings.lm_device,
            kv_cache_mb=settings.lm_kv_cache_mb,
            max_step_tokens=settings.lm_max_step_tokens,
            max_running=settings.lm_max_running,
            cpu_threads=settings.lm_cpu_threads,
        )
    raise TypeError(f"no runtime for model {spec.ref} ({type(spec).__name__})")


def artifact_path(spec: ModelSpec, settings: Settings) -> str | None:
    """The files a spec's sha256 covers: its artifact; for the embedding model without
    one, the worker's embed_model_dir or the packaged weights. None: no files."""
    if spec.artifact:
        return spec.artifact
    if isinstance(spec, EmbedSpec):
        from core.models.text_tokenizer import model_files_dir

        return str(model_files_dir(settings.embed_model_dir))
    return None


def verified_sha256(spec: ModelSpec, settings: Settings) -> str:
    """The artifact's digest, checked against the spec's when it pins one."""
    path = artifact_path(spec, settings)
    if path is None:
        if spec.sha256:
            raise ArtifactError(f"{spec.ref} pins sha256 {spec.sha256} but names no artifact")
        return ""
    if spec.sha256:
        return verify(path, spec.sha256)
    from core.models.artifact import artifact_sha256

    return artifact_sha256(path)


@dataclass
class Loaded:
    model: Model
    info: ModelInfo


def load_record(record: VersionRecord, settings: Settings) -> Loaded:
    """Verify, load and warm up one version; ``ArtifactError`` on a digest mismatch."""
    spec = spec_from_record(record, settings)
    digest = verified_sha256(spec, settings)
    model = load_model(spec, settings)
    if settings.worker_stats and hasattr(model, "timing"):
        model.timing = True
    try:
        profile = model.warmup()
    except Exception:
        model.close()
        raise
    # Warm-up may bound the batch below the spec's (GPU memory per batch size).
    limit = model.batch_limit()
    profile = {n: ms for n, ms in profile.items() if n <= limit}
    gen = getattr(model, "generation_info", None)  # a generation model's pool
    info = ModelInfo(
        record.name,
        record.version,
        limit,
        profile,
        generation=gen() if gen is not None else None,
        record=record,
        sha256=digest,
        memory_bytes=model.memory_bytes(),
    )
    log.info(
        "model %s ready (sha256 %s), max batch %d, %.0f MB, warm-up profile %s",
        record.ref,
        digest[:12] or "-",
        limit,
        info.memory_bytes / 1e6,
        profile,
    )
    return Loaded(model, info)


def boot_records(settings: Settings, names: list[str]) -> list[VersionRecord]:
    """The built-in versions a worker loads before any scheduler asks: every requested
    ``name`` or ``name@version`` (all built-in versions for a bare name)."""
    builtins = {(r.name, r.version): r for r in builtin_records(settings)}
    specs = build_specs(settings)
    out: list[VersionRecord] = []
    for ref in names:
        name, _, version = ref.partition("@")
        if name not in specs:
            raise SystemExit(f"unknown model {name!r}; built in: {', '.join(sorted(specs))}")
        if version and version not in specs[name]:
            raise SystemExit(f"unknown version {ref!r}")
        out += [r for (n, v), r in builtins.items() if n == name and (not version or v == version)]
    return out


def load_models(settings: Settings, names: list[str]) -> dict[ModelRef, Model]:
    """Load the built-in versions ``names`` asks for (benchmarks, the planner)."""
    return {
        ModelRef(r.name, r.version): load_record(r, settings).model
        for r in boot_records(settings, names)
    }
