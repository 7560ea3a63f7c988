"""The built-in versions as specs, by name and version. Several versions may run side by side.

Built from settings so knobs like the simulated batch cost are configurable. The
registry (core/models/registry.py) adds the versions registered since; the built-ins
are the specs a process falls back on before it has read the registry.
Importing this module must stay cheap: the API uses it to validate requests.
"""

from __future__ import annotations

from collections.abc import Iterable

from core.config import ModelSettings
from core.models.registry import (
    VersionRecord,
    builtin_records,
    spec_from_record,
    version_order,
)
from core.models.spec import ModelSpec


def build_specs(settings: ModelSettings) -> dict[str, dict[str, ModelSpec]]:
    return specs_by_name(builtin_records(settings), settings)


def specs_by_name(
    records: Iterable[VersionRecord], settings: ModelSettings
) -> dict[str, dict[str, ModelSpec]]:
    out: dict[str, dict[str, ModelSpec]] = {}
    for record in records:
        spec = spec_from_record(record, settings)
        out.setdefault(spec.name, {})[spec.version] = spec
    return out


def latest(versions: dict[str, ModelSpec]) -> ModelSpec:
    """Highest version wins when a request names no version (numeric-aware)."""
    return versions[max(versions, key=version_order)]
