"""What a model accepts: its name, version, batch limit and parameters.

A ``ModelSpec`` is light: the API validates requests against it without loading
weights, the scheduler keys batches by it. It says nothing about how the model
runs (device, precision, graphs): that is the worker's (workers/models/loader.py
turns a spec and the worker's runtime settings into a ``Model``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from core.errors import InvalidInput
from core.limits import check_number, check_text, shown


@dataclass(frozen=True)
class ParamSpec:
    """A request parameter. ``batching`` params change the computation, so requests
    that differ in one never share a batch (they are part of the batch key)."""

    name: str
    type: type
    default: Any
    batching: bool = True


@dataclass
class ModelSpec:
    name: str
    version: str
    max_batch_size: int
    max_input_chars: int = 20_000
    params: tuple[ParamSpec, ...] = field(default_factory=tuple)
    max_param_chars: int = 1_000  # one string parameter (settings.max_param_chars)
    # Where its weights are (a file or directory; empty: none, or the packaged ones) and
    # the sha256 a worker checks them against before loading (core/models/artifact.py).
    artifact: str = ""
    sha256: str = ""

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def validate_input(self, value: Any) -> None:
        """Text models take one non-empty string per request, one that PostgreSQL and
        Kafka can carry (core/limits.py)."""
        if not isinstance(value, str):
            raise InvalidInput(f"input must be a string, got {type(value).__name__}", field="input")
        # The length first: the scans below are linear in it.
        check_text(value, "input", max_chars=self.max_input_chars)
        if not value.strip():
            raise InvalidInput("input must not be empty", field="input")

    def normalize_params(self, params: dict[str, Any] | None) -> dict[str, Any]:
        """Fill defaults and reject unknown, mistyped or unstorable parameters."""
        params = dict(params or {})
        known = {p.name: p for p in self.params}
        unknown = sorted(set(params) - set(known))
        if unknown:
            allowed = ", ".join(sorted(known)) or "none"
            bad = unknown[0]
            # The name goes back to the client: quoted, escaped, short.
            simple = bad if len(bad) <= 64 and bad.isidentifier() else None
            raise InvalidInput(
                f"unknown parameter {shown(bad)} for model {self.name} (allowed: {allowed})",
                field=f"params.{simple}" if simple else "params",
            )
        out: dict[str, Any] = {}
        for p in self.params:
            value = params.get(p.name, p.default)
            where = f"params.{p.name}"
            # bool is an int subclass; do not let True pass as a number or vice versa.
            if not isinstance(value, p.type) or (p.type is not bool and isinstance(value, bool)):
                raise InvalidInput(f"parameter {p.name} must be {p.type.__name__}", field=where)
            if isinstance(value, str):
                check_text(value, where, max_chars=self.max_param_chars)
            elif isinstance(value, int | float) and not isinstance(value, bool):
                check_number(value, where)
            out[p.name] = value
        return out

    def batch_params(self, params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
        """The part of the (normalized) params that goes into the batch key, sorted by
        name. A missing one raises ``KeyError`` naming the first in declaration order.
        The scheduler calls this once a message: the names are worked out once a spec."""
        cached = self.__dict__.get("_batching")
        if cached is None or cached[0] is not self.params:
            cached = self._batching_names()
        names = cached[1]
        if len(names) == 1:  # the common case, without a list
            return ((names[0], params[names[0]]),)
        pairs = [(name, params[name]) for name in names]
        if not cached[2]:
            pairs.sort()
        return tuple(pairs)

    def _batching_names(self) -> tuple[tuple[ParamSpec, ...], tuple[str, ...], bool]:
        """The batching params' names in declaration order, and whether that order is
        already sorted (strictly: equal names would compare their values), with the
        ``params`` they were read from: a spec whose params are replaced works them out
        again. Kept in the instance's ``__dict__``, so a frozen subclass may cache too."""
        names = tuple(p.name for p in self.params if p.batching)
        in_order = all(a < b for a, b in itertools.pairwise(names))
        cached = self.__dict__["_batching"] = (self.params, names, in_order)
        return cached

    def embedding_dim(self) -> int | None:
        """Length of the vector the model answers each input with; None for a model
        whose answers are not embeddings (the embeddings APIs refuse it)."""
        return None

    def message_input(self, value: Any) -> Any:
        """What the request message carries for a validated ``value``. Text models that
        can tokenize in the API tier return ``{"text", "ids"}`` (token_ids.py); the
        default carries the input as it came."""
        return value
