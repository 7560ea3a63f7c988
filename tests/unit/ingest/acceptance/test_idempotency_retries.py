"""ingest/acceptance/idempotency.py: which version a retry is sent again on (decision 44)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from core.config import Settings
from core.messages import RequestMessage, body_hash
from core.models.catalog import build_specs
from core.models.spec import ModelSpec
from ingest.acceptance.idempotency import aim, first_version
from ingest.acceptance.ports import Claim

SPECS = build_specs(Settings())
V1 = SPECS["sim"]["1"]


class Pinned:
    """The catalog's one call a retry makes: the spec of a pinned version."""

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self.asked: list[str] = []

    async def resolve(self, ref: str, **_: Any) -> ModelSpec:
        self.asked.append(ref)
        return self.spec


def test_a_first_attempt_or_an_unchanged_route_keeps_the_spec() -> None:
    cat = Pinned(V1)
    for c in (
        None,
        Claim(True, "r", version="1"),
        Claim(False, "r", None, None, None),  # an old claim: where routing says now
        Claim(False, "r", None, None, "1"),
    ):
        assert asyncio.run(first_version(cat, V1, c)) is V1  # type: ignore[arg-type]
    assert cat.asked == []


def test_a_retry_routed_elsewhere_now_goes_to_its_first_version_pinned() -> None:
    cat = Pinned(V1)
    c = Claim(False, "r", datetime.now(UTC), None, "7")
    assert asyncio.run(first_version(cat, V1, c)) is V1  # type: ignore[arg-type]
    assert cat.asked == ["sim@7"]


def test_aim_points_an_unsent_message_at_a_version() -> None:
    msg = RequestMessage("r", "t", "paid", "sim", "2", "x", {}, 1.0, 0.0)
    aim(msg, V1, "hello")
    assert (msg.model, msg.version, msg.input) == ("sim", "1", V1.message_input("hello"))


def test_the_fingerprint_is_what_the_caller_sent() -> None:
    # The same body whatever version answers it; another model name is another body.
    assert body_hash("sim", "x", {}) == body_hash("sim", "x", {})
    assert body_hash("sim", "x", {}) != body_hash("sim@1", "x", {})
