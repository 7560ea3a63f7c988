"""What a gateway in front of the API may say about a request: the Gateway API
Inference Extension's ``x-gateway-inference-objective`` names the InferenceObjective
the route matched, read here as a tier hint. Pure.

A hint can only lower a request: it is scheduled in the lower of the tier the door
chose (the key's, or lower, e.g. Triton's ``priority``) and the tier its objective asks
for, so a gateway, or a client that sets the header itself, never lifts a key above
what it pays for (decision 56). An objective the configuration does not name asks for
nothing: the platform may define objectives this deployment has no opinion about.
"""

from __future__ import annotations

from collections.abc import Mapping

from core.vocab import TIERS, Tier

OBJECTIVE_HEADER = b"x-gateway-inference-objective"


def objective_tier(objectives: Mapping[str, Tier], objective: str | None) -> Tier | None:
    """The tier ``objective`` asks for, or None."""
    if objective is None:
        return None
    name = objective.strip()
    if name in objectives:
        return objectives[name]
    try:
        return Tier(name)
    except ValueError:
        return None


def scheduled_tier(chosen: str, asked: Tier | None) -> str:
    """The tier a request is scheduled in: ``chosen`` by its door, lowered (never
    raised) to ``asked``."""
    if asked is None or TIERS.index(asked) >= TIERS.index(Tier(chosen)):
        return chosen
    return str(asked)
