"""``gristmill-lm``: a small causal language model that generates text (decision 23).

What a generation request may ask, checked where it enters (the API, or a job's
submission), so that anything accepted can run: a prompt of at least one token that
leaves room for one output token in the model's context, and the sampling parameters
OpenAI's completions take (``max_tokens``, ``temperature``, ``seed``, ``stop``), with
OpenAI's defaults. The message carries the prompt's token ids (tokenized once, in the
API tier) and a seed whenever the answer is sampled, so a request generated again
after a crash draws the same tokens (decision 23, "Sampling").

Light like every spec: the tokenizer (``tokenizers``, no torch) loads on first use.
The model runs in a worker (workers/models/causal_lm/), the continuous-batching
policy in the scheduler (scheduler/core/generation/).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.errors import InvalidInput, Unavailable
from core.models.spec import ModelSpec, ParamSpec
from core.models.token_ids import tokenized_input

# OpenAI's defaults and limits for completions, so its clients behave as they expect.
DEFAULT_MAX_TOKENS = 16
DEFAULT_TEMPERATURE = 1.0
MAX_TEMPERATURE = 2.0
MAX_STOPS = 4
# A stream holds back the last (longest stop - 1) characters until they cannot start a
# stop string, and releases them with one token: capped so that what one token releases
# always fits one stream notification (decision 24).
MAX_STOP_CHARS = 256
# Seeds travel in JSON and are stored in the request log's params: a signed 64-bit range.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1

PARAM_NAMES = ("max_tokens", "temperature", "seed", "stop")


@dataclass
class CausalLMSpec(ModelSpec):
    # Positions the model has (prompt + output); the worker refuses weights of another size.
    context_length: int = 512
    # Its weights when not the packaged ones nor an artifact: the packaged ones with
    # seeded noise of ``weights_noise`` times each tensor's spread (decision 67).
    weights_seed: int | None = None
    weights_noise: float = 0.05
    params: tuple[ParamSpec, ...] = (
        # Documentation for the model listing; ``normalize_params`` does the checking (a
        # seed may be absent, a stop is a string or a list).
        ParamSpec("max_tokens", int, DEFAULT_MAX_TOKENS, batching=False),
        ParamSpec("temperature", float, DEFAULT_TEMPERATURE, batching=False),
        ParamSpec("seed", int, None, batching=False),
        ParamSpec("stop", list, None, batching=False),
    )

    # ---- the prompt ----------------------------------------------------------------
    def encode_prompt(self, value: Any, field: str = "input") -> list[int]:
        """The prompt's token ids, or InvalidInput naming ``field``."""
        if not isinstance(value, str):
            raise InvalidInput(f"{field} must be a string, got {type(value).__name__}", field=field)
        if not value:
            raise InvalidInput(f"{field} must not be empty", field=field)
        if "\x00" in value:
            raise InvalidInput(f"{field} must not contain NUL characters", field=field)
        if len(value) > self.max_input_chars:
            raise InvalidInput(
                f"{field} is {len(value)} characters; at most {self.max_input_chars} allowed",
                field=field,
            )
        ids = codec().encode(value)
        if len(ids) >= self.context_length:
            raise InvalidInput(
                f"{field} is {len(ids)} tokens; this model's context holds "
                f"{self.context_length} tokens, prompt and completion together",
                field=field,
            )
        return ids

    def validate_input(self, value: Any) -> None:
        self.encode_prompt(value)

    def message_input(self, value: Any) -> Any:
        return tokenized_input(value, self.encode_prompt(value))

    # ---- sampling parameters -------------------------------------------------------
    def normalize_params(self, params: dict[str, Any] | None) -> dict[str, Any]:
        return generation_params(params or {}, prefix="params.")

    def check_fits(self, prompt_tokens: int, max_tokens: int) -> None:
        """OpenAI's rule: the prompt and ``max_tokens`` must fit the context."""
        if prompt_tokens + max_tokens > self.context_length:
            raise InvalidInput(
                f"this model's maximum context length is {self.context_length} tokens, "
                f"however you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} "
                f"in your prompt; {max_tokens} for the completion); reduce the prompt or "
                "max_tokens",
                field="max_tokens",
            )


def generation_params(values: Mapping[str, Any], *, prefix: str = "") -> dict[str, Any]:
    """``max_tokens``, ``temperature``, ``stop`` (a list) and, when the answer is sampled,
    a ``seed`` (the caller's, else a random one, so that regenerating repeats it).
    Unknown names are refused; errors name ``prefix + name``."""
    unknown = sorted(set(values) - set(PARAM_NAMES))
    if unknown:
        raise InvalidInput(
            f"unknown parameter {unknown[0]!r} (allowed: {', '.join(PARAM_NAMES)})",
            field=prefix + unknown[0],
        )

    def fail(name: str, why: str) -> InvalidInput:
        return InvalidInput(f"{name} {why}", field=prefix + name)

    max_tokens = values.get("max_tokens")
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    if not _is_int(max_tokens) or max_tokens < 1:
        raise fail("max_tokens", "must be an integer of at least 1")
    temperature = values.get("temperature")
    temperature = DEFAULT_TEMPERATURE if temperature is None else temperature
    if (
        not isinstance(temperature, int | float)
        or isinstance(temperature, bool)
        or not 0 <= temperature <= MAX_TEMPERATURE
    ):
        raise fail("temperature", f"must be a number from 0 to {MAX_TEMPERATURE:g}")
    out: dict[str, Any] = {"max_tokens": max_tokens, "temperature": float(temperature)}
    seed = values.get("seed")
    if seed is not None and (not _is_int(seed) or not SEED_MIN <= seed <= SEED_MAX):
        raise fail("seed", "must be an integer that fits in 64 bits (signed)")
    if seed is None and temperature > 0:
        seed = secrets.randbits(63)
    if seed is not None:
        out["seed"] = seed
    out["stop"] = _stops(values.get("stop"), fail)
    return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _stops(value: Any, fail: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise fail("stop", "must be a string or a list of strings")
    if len(stops) > MAX_STOPS:
        raise fail("stop", f"may hold at most {MAX_STOPS} strings")
    for s in stops:
        if not 0 < len(s) <= MAX_STOP_CHARS:
            raise fail("stop", f"strings must be 1 to {MAX_STOP_CHARS} characters")
        if "\x00" in s:
            raise fail("stop", "strings must not contain NUL characters")
    return list(dict.fromkeys(stops))  # a repeated stop string changes nothing


def codec() -> Any:
    """The shared tokenizer (core/models/lm_codec.py); 503 where it cannot load."""
    from core.models.lm_codec import shared_codec

    try:
        return shared_codec()
    except (ImportError, OSError) as exc:
        raise Unavailable(
            f"the language model's tokenizer cannot be loaded here ({exc})", retry_after_s=30
        ) from exc
