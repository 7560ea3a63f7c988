"""Turn a model's spec (what it accepts, core/models/) and the worker's runtime
settings (how it runs: device, precision, graphs) into a loaded ``Model``.

Called in the worker process only: loading the embedding model imports torch.
"""

from __future__ import annotations

from core.config import Settings
from core.models.catalog import build_specs, latest
from core.models.causal_lm import CausalLMSpec
from core.models.embedding import EmbedSpec
from core.models.sim import SimSpec
from core.models.spec import ModelSpec
from core.vocab import ModelRef
from workers.models.base import Model
from workers.models.sim import SimModel


def load_model(spec: ModelSpec, settings: Settings) -> Model:
    """Load weights and return a ready model: the worker runtime's knobs
    (``WorkerSettings``) and where the weights are (``embed_model_dir``)."""
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
            ),
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


def load_models(settings: Settings, names: list[str]) -> dict[ModelRef, Model]:
    """Load every requested ``name`` or ``name@version`` (all versions for a bare name)."""
    specs = build_specs(settings)
    models: dict[ModelRef, Model] = {}
    for ref in names:
        name, _, version = ref.partition("@")
        if name not in specs:
            raise SystemExit(f"unknown model {name!r}; known: {', '.join(sorted(specs))}")
        versions = specs[name]
        chosen = [versions[version]] if version else list(versions.values())
        if version and version not in versions:
            raise SystemExit(f"unknown version {ref!r}")
        for spec in chosen or [latest(versions)]:
            models[ModelRef(spec.name, spec.version)] = load_model(spec, settings)
    return models
