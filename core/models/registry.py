"""A model version as the registry holds it, and the spec it makes.

The registry (PostgreSQL, results/modelregistry.py) is the source of truth for which
versions exist, what they are (backend, artifact and its sha256, configuration, batch
limit) and where each stands in its life:

    staged -> canary -> live -> (staged again when another is promoted) -> retired

A ``VersionRecord`` is that row as plain data: the API turns it into the spec it
validates against, the scheduler into batch keys, and a worker into a loaded model
(workers/models/loader.py), so every stage reads one definition. The two built-in
versions (``sim@1``, ``all-minilm-l6-v2@1``, ``gristmill-lm@1``) are records too, registered by
``gristmill migrate``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from core.config import ModelSettings
from core.errors import InvalidInput
from core.models.artifact import is_sha256
from core.models.causal_lm import CausalLMSpec
from core.models.embedding import EmbedSpec
from core.models.http import HttpSpec, TemplateError, params_from_config
from core.models.sim import SimSpec
from core.models.spec import ModelSpec

LM_NAME = "gristmill-lm"
LM_MAX_RUNNING = 64  # sequences one generation worker runs together (decision 23)
LM_CONTEXT_LENGTH = 512  # the packaged weights' positions (CausalLMSpec's default)
# A seeded version's weights: the packaged ones plus Gaussian noise of this share of each
# tensor's own spread (decision 67). 0.05 changes the greedy text of most prompts within
# a few tokens while the text stays the corpus's kind.
DEFAULT_WEIGHTS_NOISE = 0.05


class VersionState(StrEnum):
    STAGED = "staged"  # registered; served only when pinned (model@version) or replayed
    CANARY = "canary"  # gets its configured share of unpinned traffic
    LIVE = "live"  # unpinned traffic goes here; at most one per model
    RETIRED = "retired"  # drained and unloaded; answers no request


class Backend(StrEnum):
    SIM = "sim"
    EMBEDDING = "embedding"
    HTTP = "http"
    CAUSAL_LM = "causal-lm"  # text generation (decision 23): continuous batching


# What the keys of a version's config may be, per backend (the rest is refused, so a
# typo is an error at registration rather than a silently ignored setting).
CONFIG_KEYS: dict[Backend, frozenset[str]] = {
    Backend.SIM: frozenset({"batch_ms", "variant", "memory_mb", "load_ms", "vector_dim"}),
    Backend.EMBEDDING: frozenset({"max_tokens"}),
    # Another set of weights: an artifact (train.py's folder), or the packaged weights
    # perturbed by a seed (decision 67).
    Backend.CAUSAL_LM: frozenset({"context_length", "weights_seed", "weights_noise"}),
    Backend.HTTP: frozenset(
        {
            "url",
            "request_template",
            "response_path",
            "concurrency",
            "timeout_ms",
            "probe_input",
            "params",
        }
    ),
}


class RecordError(ValueError):
    """A version record that cannot make a spec (unknown backend, bad configuration)."""


@dataclass(frozen=True)
class VersionRecord:
    name: str
    version: str
    backend: str
    max_batch_size: int
    config: Mapping[str, Any] = field(default_factory=dict)
    artifact: str = ""  # a file or directory; empty: none (sim, http) or the packaged one
    sha256: str = ""  # of the artifact; empty: nothing to verify
    state: VersionState = VersionState.STAGED
    canary_share: float = 0.0  # 0..1, of unpinned traffic (state canary only)
    memory_bytes: int = 0  # estimate before it is loaded (artifact size, or configured)

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def same_artifact(self, other: VersionRecord) -> bool:
        """Whether a worker holding ``other`` holds this (nothing that changes the
        computation differs)."""
        return (
            self.backend,
            self.artifact,
            self.sha256,
            dict(self.config),
            self.max_batch_size,
        ) == (other.backend, other.artifact, other.sha256, dict(other.config), other.max_batch_size)


def spec_from_record(record: VersionRecord, settings: ModelSettings) -> ModelSpec:
    """The spec a record describes; ``RecordError`` when it cannot describe one."""
    try:
        backend = Backend(record.backend)
    except ValueError:
        raise RecordError(
            f"unknown backend {record.backend!r} (one of {', '.join(Backend)})"
        ) from None
    extra = set(record.config) - CONFIG_KEYS[backend]
    if extra:
        allowed = ", ".join(sorted(CONFIG_KEYS[backend])) or "none"
        raise RecordError(
            f"unknown config key {sorted(extra)[0]!r} for {backend} (allowed: {allowed})"
        )
    if record.max_batch_size < 1:
        raise RecordError("max_batch_size must be at least 1")
    c = record.config
    common: dict[str, Any] = {
        "name": record.name,
        "version": record.version,
        "max_batch_size": record.max_batch_size,
        "max_input_chars": settings.max_input_chars,
        "max_param_chars": settings.max_param_chars,
        "artifact": record.artifact,
        "sha256": record.sha256,
    }
    try:
        if backend is Backend.SIM:
            return SimSpec(
                **common,
                batch_ms=float(c.get("batch_ms", settings.sim_batch_ms)),
                variant=str(c.get("variant", "")),
                memory_mb=float(c.get("memory_mb", 0.0)),
                load_ms=float(c.get("load_ms", 0.0)),
                vector_dim=int(c.get("vector_dim", settings.sim_vector_dim)),
            )
        if backend is Backend.CAUSAL_LM:
            return _causal_lm_spec(common, c)
        if backend is Backend.EMBEDDING:
            max_tokens = int(c.get("max_tokens", settings.embed_max_tokens))
            if not 2 <= max_tokens <= 512:
                raise RecordError("max_tokens must be 2..512 (the model's position table)")
            return EmbedSpec(
                **common,
                max_tokens=max_tokens,
                # The API tokenizes with the packaged tokenizer (or embed_model_dir): a
                # version that changes the vocabulary must not claim this backend.
                tokenizer_dir=settings.embed_model_dir,
            )
        return HttpSpec(
            **common,
            params=params_from_config(c.get("params")),
            url=str(c.get("url", "")),
            request_template=c.get("request_template", {"input": "{{input}}"}),
            response_path=str(c.get("response_path", "")),
            concurrency=int(c.get("concurrency", 8)),
            timeout_ms=int(c.get("timeout_ms", 10_000)),
            probe_input=str(c.get("probe_input", "ping")),
        )
    except (TemplateError, TypeError, ValueError) as exc:
        if isinstance(exc, RecordError):
            raise
        raise RecordError(f"{record.ref}: {exc}") from exc


_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,31}")


def new_record(
    ref: str,
    *,
    backend: str,
    max_batch_size: int,
    config: Mapping[str, Any] | None = None,
    artifact: str = "",
    sha256: str = "",
    memory_bytes: int = 0,
    settings: ModelSettings,
) -> VersionRecord:
    """A staged version to register, checked as far as it can be without its files:
    names, backend and configuration (a spec must come of it), and an artifact pinned
    by its sha256. ``InvalidInput`` names the field at fault."""
    name, version = parse_ref(ref)
    if not _NAME.fullmatch(name):
        raise InvalidInput(
            "a model name is 1-64 of a-z 0-9 . _ - and starts with a letter or digit",
            field="model",
        )
    if not version or not _VERSION.fullmatch(version):
        raise InvalidInput(
            "name the version to register as name@version (1-32 of A-Z a-z 0-9 . _ -)",
            field="model",
        )
    if sha256 and not is_sha256(sha256):
        raise InvalidInput("sha256 must be 64 hexadecimal characters", field="sha256")
    if artifact and not sha256:
        raise InvalidInput("an artifact must be pinned by its sha256", field="sha256")
    if memory_bytes < 0:
        raise InvalidInput("memory_bytes must not be negative", field="memory_bytes")
    if backend == Backend.CAUSAL_LM and name != LM_NAME:
        # The scheduler's generation worker serves the versions of one model, with the
        # packaged tokenizer (decision 67): another name would be served by nothing.
        raise InvalidInput(
            f"backend {backend} serves versions of {LM_NAME} only; register other "
            "generation models behind the http backend",
            field="backend",
        )
    record = VersionRecord(
        name,
        version,
        backend,
        max_batch_size,
        dict(config or {}),
        artifact,
        sha256.lower(),
        VersionState.STAGED,
        0.0,
        memory_bytes,
    )
    try:
        spec_from_record(record, settings)
    except RecordError as exc:
        raise InvalidInput(str(exc), field="config") from exc
    return record


def _causal_lm_spec(common: dict[str, Any], c: Mapping[str, Any]) -> CausalLMSpec:
    seed = c.get("weights_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise RecordError("weights_seed must be a non-negative integer")
    noise = c.get("weights_noise", DEFAULT_WEIGHTS_NOISE)
    if isinstance(noise, bool) or not isinstance(noise, int | float) or not 0 < noise <= 1:
        raise RecordError("weights_noise must be a number above 0 and at most 1")
    if seed is not None and common["artifact"]:
        raise RecordError("a version's weights come from its artifact or a seed, not both")
    return CausalLMSpec(
        **common,
        context_length=int(c.get("context_length", LM_CONTEXT_LENGTH)),
        weights_seed=seed,
        weights_noise=float(noise),
    )


def builtin_records(settings: ModelSettings) -> list[VersionRecord]:
    """The versions that ship with Gristmill, live until the registry says otherwise."""
    return [
        VersionRecord("sim", "1", Backend.SIM, settings.sim_max_batch, state=VersionState.LIVE),
        VersionRecord(
            "all-minilm-l6-v2",
            "1",
            Backend.EMBEDDING,
            settings.embed_max_batch,
            artifact=settings.embed_model_dir,
            state=VersionState.LIVE,
            memory_bytes=91_000_000,  # the packaged fp32 weights
        ),
        # Continuous batching (decision 23): the batch size is the running sequences' cap.
        VersionRecord(LM_NAME, "1", Backend.CAUSAL_LM, LM_MAX_RUNNING, state=VersionState.LIVE),
    ]


def with_state(record: VersionRecord, state: VersionState, share: float = 0.0) -> VersionRecord:
    return replace(record, state=state, canary_share=share if state is VersionState.CANARY else 0.0)


def version_order(v: str) -> tuple[int, int, str]:
    """Numeric versions in number order, after any others (which sort as text)."""
    return (1, int(v), "") if v.isdigit() else (0, 0, v)


def parse_ref(ref: str) -> tuple[str, str]:
    """``name@version`` -> (name, version); ``name`` -> (name, "")."""
    name, _, version = ref.partition("@")
    return name, version
