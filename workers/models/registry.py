"""Which models exist, by name and version. Several versions may run side by side.

Built from settings so knobs like the simulated batch cost are configurable.
Importing this module must stay cheap: ingest uses it to validate requests.
"""

from __future__ import annotations

from core.config import Settings
from workers.models.base import ModelSpec
from workers.models.embedding import EmbedSpec
from workers.models.sim import SimSpec

DEFAULT_MODEL = "sim"


def build_specs(settings: Settings) -> dict[str, dict[str, ModelSpec]]:
    specs: list[ModelSpec] = [
        SimSpec(
            name="sim",
            version="1",
            max_batch_size=settings.sim_max_batch,
            max_input_chars=settings.max_input_chars,
            batch_ms=settings.sim_batch_ms,
            poison_prefix=settings.sim_poison_prefix,
        ),
        EmbedSpec(
            name="all-minilm-l6-v2",
            version="1",
            max_batch_size=settings.embed_max_batch,
            max_input_chars=settings.max_input_chars,
            device=settings.embed_device,
            max_tokens=settings.embed_max_tokens,
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
