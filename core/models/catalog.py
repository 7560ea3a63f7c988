"""Which models exist, by name and version. Several versions may run side by side.

Built from settings so knobs like the simulated batch cost are configurable.
Importing this module must stay cheap: the API uses it to validate requests.
"""

from __future__ import annotations

from core.config import ModelSettings
from core.models.causal_lm import CausalLMSpec
from core.models.embedding import EmbedSpec
from core.models.sim import SimSpec
from core.models.spec import ModelSpec

LM_NAME = "gristmill-lm"


def build_specs(settings: ModelSettings) -> dict[str, dict[str, ModelSpec]]:
    specs: list[ModelSpec] = [
        SimSpec(
            name="sim",
            version="1",
            max_batch_size=settings.sim_max_batch,
            max_input_chars=settings.max_input_chars,
            max_param_chars=settings.max_param_chars,
            batch_ms=settings.sim_batch_ms,
            vector_dim=settings.sim_vector_dim,
        ),
        EmbedSpec(
            name="all-minilm-l6-v2",
            version="1",
            max_batch_size=settings.embed_max_batch,
            max_input_chars=settings.max_input_chars,
            max_param_chars=settings.max_param_chars,
            max_tokens=settings.embed_max_tokens,
            tokenizer_dir=settings.embed_model_dir,
        ),
        # Continuous batching (decision 23): the batch size is the running sequences' cap.
        CausalLMSpec(
            name=LM_NAME,
            version="1",
            max_batch_size=64,
            max_input_chars=settings.max_input_chars,
        ),
    ]
    out: dict[str, dict[str, ModelSpec]] = {}
    for spec in specs:
        out.setdefault(spec.name, {})[spec.version] = spec
    return out


def latest(versions: dict[str, ModelSpec]) -> ModelSpec:
    """Highest version wins when a request names no version (numeric-aware)."""

    def order(v: str) -> tuple[int, str]:
        return (int(v), "") if v.isdigit() else (-1, v)

    return versions[max(versions, key=order)]
