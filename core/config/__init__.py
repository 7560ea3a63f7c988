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

import json
from collections.abc import Mapping
from typing import Self, get_origin

from pydantic import AliasChoices, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.config._base import PositiveMs
from core.config.api import ApiSettings, EdgeSettings
from core.config.jobs import FileSettings, JobSettings, RetentionSettings
from core.config.operations import LedgerSettings, ObservabilitySettings
from core.config.runtime import ModelSettings, SchedulerSettings, WorkerSettings
from core.config.tiers import TierSettings
from core.config.transport import DatabaseSettings, DurabilitySettings, KafkaSettings

__all__ = [
    "ApiSettings",
    "DatabaseSettings",
    "DurabilitySettings",
    "EdgeSettings",
    "FileSettings",
    "JobSettings",
    "KafkaSettings",
    "LedgerSettings",
    "ModelSettings",
    "ObservabilitySettings",
    "PositiveMs",
    "RetentionSettings",
    "SchedulerSettings",
    "Settings",
    "TierSettings",
    "WorkerSettings",
    "load_settings",
    "settings_from_env",
]


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
