"""Shared pieces of the settings: the concern base class, a positive-milliseconds type
and the tier-order rule."""

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


class _Concern(BaseModel):
    model_config = ConfigDict(extra="ignore", validate_by_name=True, validate_by_alias=True)


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
