"""What a gateway in front of the API may say about a request: the Gateway API
Inference Extension's ``x-gateway-inference-objective`` names the InferenceObjective
the route matched, read here as a tier hint. Pure.

A hint can only lower a request: it is scheduled in the lower of the tier the door
chose (the key's, or lower, e.g. Triton's ``priority``) and the tier its objective asks
for, so a gateway, or a client that sets the header itself, never lifts a key above
what it pays for (decision 56). An objective the configuration does not name asks for
nothing: the platform may define objectives this deployment has no opinion about.

``x-gateway-inference-fairness-id`` names who inside the tenant sent the request (an end
user of the key, a flow): the scheduler's fair queue lets a tenant's flows take turns
inside the tenant's own turn, never beside it (decision 58). It is checked here, so a
bad one is a 400 naming the header before anything is charged.
"""

from __future__ import annotations

from collections.abc import Mapping

from core.limits import check_header_token
from core.vocab import TIERS, Tier

OBJECTIVE_HEADER = b"x-gateway-inference-objective"
FAIRNESS_HEADER = b"x-gateway-inference-fairness-id"
# Ids are a gateway's names for users or flows (llm-d and KServe pass user names, API
# key ids, session ids): 256 holds any of them, and bounds what a message carries.
FAIRNESS_ID_MAX_CHARS = 256


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


def fairness_id(value: str | None) -> str | None:
    """The flow the request belongs to inside its tenant: the header's value (1 to 256
    printable ASCII characters), None when absent or empty (the tenant's default flow),
    or a 400 naming the header."""
    if value is None or value == "":
        return None
    return check_header_token(value, FAIRNESS_HEADER.decode(), max_chars=FAIRNESS_ID_MAX_CHARS)
