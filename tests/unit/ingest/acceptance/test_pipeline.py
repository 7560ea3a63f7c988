"""ingest/acceptance/pipeline.py's pure parts and the rate a many-input request pays
(ingest/admission/policy.py)."""

from __future__ import annotations

import uuid

import pytest

from core.config import Settings
from core.errors import InvalidInput, RateLimited
from core.models.sim import SimSpec
from ingest.acceptance.pipeline import default_timeout_ms, item_request_id, validate_each
from ingest.admission.policy import check_rate
from ingest.admission.ratelimit import TenantLimiter
from results.tenants import Tenant


def test_ids_derive_from_the_first_stably_and_distinctly() -> None:
    first = str(uuid.uuid4())
    ids = [item_request_id(first, i) for i in range(3)]
    assert ids == [item_request_id(first, i) for i in range(3)]
    assert ids[0] == first and len(set(ids)) == 3
    assert all(str(uuid.UUID(i)) == i for i in ids)  # canonical: /v1/requests/{id} finds them
    assert item_request_id(str(uuid.uuid4()), 1) != ids[1]


def test_validate_each_names_the_input() -> None:
    spec = SimSpec(name="sim", version="1", max_batch_size=8, max_input_chars=10)
    validate_each(spec, ["a", "b"], lambda i: f"input[{i}]")
    with pytest.raises(InvalidInput) as e:
        validate_each(spec, ["a", "   "], lambda i: f"input[{i}]")
    assert e.value.field == "input[1]" and e.value.message.startswith("input[1]")
    with pytest.raises(InvalidInput) as e:
        validate_each(spec, ["a" * 11], lambda i: "input")
    assert e.value.field == "input"


def test_many_inputs_cost_one_token_each_and_are_not_refused_for_size() -> None:
    s = Settings(
        tier_rate_rps={"free": 1, "paid": 2, "enterprise": 3},
        tier_burst={"free": 4, "paid": 5, "enterprise": 6},
    )
    limiter = TenantLimiter()
    t = Tenant(id="t", name="t", tier="free")
    # Larger than the burst (4): taken while the bucket holds tokens, leaving it in debt.
    check_rate(limiter, s, t, items=10)
    with pytest.raises(RateLimited) as e:
        check_rate(limiter, s, t)
    assert e.value.retry_after_s is not None and e.value.retry_after_s > 5


def test_the_default_deadline_grows_with_the_batches_the_inputs_fill() -> None:
    assert default_timeout_ms(2000, 1, 256, 300_000) == 2000
    assert default_timeout_ms(2000, 256, 256, 300_000) == 2000
    assert default_timeout_ms(2000, 257, 256, 300_000) == 4000
    assert default_timeout_ms(2000, 2048, 256, 300_000) == 16_000
    assert default_timeout_ms(2000, 2048, 1, 300_000) == 300_000
