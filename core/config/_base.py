"""Shared pieces of the settings: the concern base class, the value types of settings
(positive milliseconds, the per-tier tables' values) and the rules between settings
(one must not exceed another, the tier order)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from core.vocab import TIERS

PositiveMs = Annotated[int, Field(gt=0)]
# The value types of the per-tier tables, named so that each table fits on a line.
AtLeastOne = Annotated[int, Field(ge=1)]
PositiveFloat = Annotated[float, Field(gt=0)]
Share = Annotated[float, Field(gt=0, le=1)]  # of a whole


class _Concern(BaseModel):
    model_config = ConfigDict(extra="ignore", validate_by_name=True, validate_by_alias=True)


def _check_not_above(settings: BaseModel, *pairs: tuple[str, str]) -> None:
    """Each ``(part, whole)`` names two settings where ``part`` must not exceed ``whole``
    (a tenant's share of an instance's bound, a default within its maximum)."""
    for part, whole in pairs:
        a, b = getattr(settings, part), getattr(settings, whole)
        if a > b:
            raise ValueError(f"{part} ({a}) must not exceed {whole} ({b})")


def _check_tier_order(name: str, values: Mapping[str, object], rises: bool) -> None:
    """``values`` by tier must rise (``rises``) or fall from free to enterprise; tiers a
    mapping leaves out are not compared. Equal neighbours are allowed."""
    listed = [t for t in TIERS if t in values]  # free, paid, enterprise
    for lo, hi in itertools.pairwise(listed):
        a, b = values[lo], values[hi]
        ok = a <= b if rises else a >= b  # type: ignore[operator]
        if not ok:
            way = "rise" if rises else "fall"
            raise ValueError(
                f"{name}: {lo} ({a}) and {hi} ({b}) out of order; it must {way} with the tier"
            )
