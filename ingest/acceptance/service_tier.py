"""``service_tier`` (decision 66): what a request asks to be served as, and what that
means for its queueing, deadline and wait. Pure.

A caller names it in the body (``service_tier``, as OpenAI's API does) or, where the
body has no room for it (KServe v2), in the ``X-Service-Tier`` header; the answer
echoes the tier it was served as in the same header, and in the body where the
protocol has a place for it.

- ``flex``: queued at job items' priority, behind every sync tier, so it runs in the
  capacity sync traffic leaves. It is never refused for capacity (only for the caller's
  own mistakes, its key or its own rate limit); its deadline is ``flex_timeout_ms``
  unless the caller sets one; its call is answered 200 when done within its patience
  (``Prefer: wait``, else ``flex_wait_ms``) or 202 with Location.
- ``default`` (or none): the key's tier, as the door and a gateway's hint lower it.
- ``priority``: the highest tier the key may use - its own, whatever the door's
  lowering (Triton's ``priority``) asked. It is echoed as ``priority`` only when that
  tier is the top one; a key whose plan has nothing above its default is served, and
  told, ``default``.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import InvalidInput
from core.limits import shown
from core.vocab import TIER_TO_CLASS, TIERS, PriorityClass, ServiceTier, Tier
from ingest.acceptance.gateway import scheduled_tier
from ingest.acceptance.prefer import Prefer

# The request header that names it where the body cannot, and the answer's echo.
SERVICE_TIER_HEADER = b"x-service-tier"
ECHO_HEADER = "X-Service-Tier"
_NAMES = ", ".join(repr(str(t)) for t in ServiceTier)


def parse_service_tier(value: object, field: str = "service_tier") -> ServiceTier | None:
    """A caller's ``service_tier`` (None: not sent), or a 400 naming ``field``."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return ServiceTier(value)
        except ValueError:
            pass
    raise InvalidInput(f"{field} must be one of {_NAMES}, got {shown(value)}", field=field)


def asked_tier(body_value: object, header: str | None) -> ServiceTier | None:
    """The tier a request asks for: its body's ``service_tier``, else its header's; a
    400 when both are sent and disagree."""
    from_body = parse_service_tier(body_value)
    from_header = None if header is None else parse_service_tier(header.strip(), "X-Service-Tier")
    if from_body is not None and from_header is not None and from_body is not from_header:
        raise InvalidInput(
            f"service_tier {from_body.value!r} and the X-Service-Tier header "
            f"{from_header.value!r} disagree; send one",
            field="service_tier",
        )
    return from_body or from_header


def may_be_flex(body: bytes, header: str | None) -> bool:
    """Whether a request refused a sync slot may still ask for flex, and so is worth
    parsing (a cheap look: a false yes only costs the parse)."""
    return b'"flex"' in body or (header is not None and header.strip() == ServiceTier.FLEX)


@dataclass(frozen=True, slots=True)
class Service:
    """How an accepted request is served."""

    served: ServiceTier  # echoed in the answer and written to the request log
    tier: str  # the tenant tier whose SLO and class a sync request takes
    priority: PriorityClass  # the class (Kafka topic) its messages are queued in

    @property
    def flex(self) -> bool:
        return self.served is ServiceTier.FLEX


def plan_service(
    asked: ServiceTier | None, key_tier: str, door_tier: str | None, hint: Tier | None
) -> Service:
    """The service of a request whose key has ``key_tier``: ``door_tier`` what its door
    chose (None: the key's), ``hint`` what a gateway's objective asks for (it can only
    lower a sync tier: acceptance/gateway.py)."""
    if asked is ServiceTier.FLEX:
        return Service(ServiceTier.FLEX, key_tier, PriorityClass.JOBS)
    chosen = key_tier if asked is ServiceTier.PRIORITY else (door_tier or key_tier)
    tier = scheduled_tier(chosen, hint)
    top = asked is ServiceTier.PRIORITY and tier == TIERS[-1]
    served = ServiceTier.PRIORITY if top else ServiceTier.DEFAULT
    return Service(served, tier, TIER_TO_CLASS[tier])


def flex_timeout_ms(asked_ms: int | None, flex_ms: int) -> int:
    """A flex request's deadline (ms from arrival): the caller's, else ``flex_ms``."""
    return asked_ms or flex_ms


def patience_s(
    service: Service,
    door_wait_s: float | None,
    prefer: Prefer,
    flex_wait_s: float,
    may_hold: bool,
) -> float | None:
    """How long the call is held open for its answers (s; None: until the deadline, a
    sync request's). A flex call waits what its door set, else what the caller prefers
    (``Prefer: respond-async``: no wait unless ``wait=N``), else ``flex_wait_s``; not
    at all when the instance holds as many flex calls as it may (``may_hold`` False):
    accepted, it is answered 202 at once rather than refused."""
    if not service.flex:
        return door_wait_s
    if not may_hold:
        return 0.0
    if door_wait_s is not None:
        return door_wait_s
    if prefer.respond_async:
        return prefer.wait_s or 0
    return flex_wait_s if prefer.wait_s is None else prefer.wait_s
