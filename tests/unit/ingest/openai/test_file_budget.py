"""ingest/openai/file_budget.py: a tenant's files on a budget (pure)."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from core.config import Settings
from core.errors import InvalidInput, PayloadTooLarge, QuotaExceeded, RateLimited
from ingest.admission.ratelimit import TenantLimiter
from ingest.openai.file_budget import (
    ANCHOR,
    SECONDS,
    Budget,
    check_jsonl,
    check_upload_rate,
    expiry,
)
from results.files import FileUsage
from results.tenants import Tenant

S = Settings()
NOW = datetime(2026, 3, 1, tzinfo=UTC)
FAST = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))


def test_a_tier_has_its_budget_and_a_file_must_fit_it() -> None:
    b = Budget.of(S, "free")
    assert b == Budget(S.tier_file_bytes["free"], S.tier_file_count["free"])
    b = Budget(1_000, 3)
    b.check(FileUsage(400, 2), 600)  # fits exactly
    with pytest.raises(QuotaExceeded) as e:
        b.check(FileUsage(400, 2), 601)
    assert e.value.status == 403 and "600 free" in e.value.message and e.value.field == "file"
    with pytest.raises(QuotaExceeded, match="3 files"):
        b.check(FileUsage(0, 3), 1)
    assert b.room(FileUsage(1_500, 1)) == 0


def test_uploads_are_rate_limited_per_key_with_a_minute_of_burst() -> None:
    limiter = TenantLimiter()
    t = Tenant("t", "t", "free")
    per_min = S.tier_file_uploads_per_min["free"]
    for _ in range(int(per_min)):
        check_upload_rate(limiter, S, t, now=0.0)
    with pytest.raises(RateLimited) as e:
        check_upload_rate(limiter, S, t, now=0.0)
    assert e.value.status == 429 and 0 < (e.value.retry_after_s or 0) <= 60 / per_min + 1e-9
    check_upload_rate(limiter, S, t, now=60 / per_min)  # one more a while later
    check_upload_rate(limiter, S, Tenant("u", "u", "free"), now=0.0)  # others unaffected


def test_expiry_is_openais_expires_after_or_the_default() -> None:
    assert expiry(None, None, NOW, 86_400) == NOW + timedelta(days=1)
    assert expiry("created_at", "3600", NOW, 1) == NOW + timedelta(hours=1)
    assert expiry("created_at", "2592000", NOW, 1) == NOW + timedelta(days=30)
    for anchor, seconds, field in [
        ("last_active_at", "3600", ANCHOR),
        (None, "3600", ANCHOR),
        ("created_at", None, SECONDS),
        ("created_at", "3599", SECONDS),
        ("created_at", "2592001", SECONDS),
        ("created_at", "3600.0", SECONDS),
        ("created_at", "٣٦٠٠", SECONDS),  # digits that are not ASCII
    ]:
        with pytest.raises(InvalidInput) as e:
            expiry(anchor, seconds, NOW, 1)
        assert e.value.field == field


@FAST
@given(seconds=st.text(max_size=20) | st.integers().map(str))
@example(seconds="9" * 5000)
def test_any_seconds_field_is_a_time_or_a_400_naming_it(seconds: str) -> None:
    try:
        got = expiry("created_at", seconds, NOW, 1)
    except InvalidInput as exc:
        assert exc.field == SECONDS
        return
    assert timedelta(hours=1) <= got - NOW <= timedelta(days=30)


def test_a_batch_file_must_be_jsonl_of_objects() -> None:
    good = b'{"custom_id": "a"}\n\n{"custom_id": "b"}'  # a blank line, no final newline
    assert check_jsonl(io.BytesIO(good), 1_000) == 2
    for bad, line in [
        (b'{"a": 1}\nnot json\n', 2),
        (b'{"a": 1}\n[1, 2]\n', 2),
        (b'"text"\n', 1),
        (b"\xff\xfe\x00binary", 1),
    ]:
        with pytest.raises(InvalidInput) as e:
            check_jsonl(io.BytesIO(bad), 1_000)
        assert f"line {line} " in e.value.message and e.value.field == "file"
    with pytest.raises(InvalidInput, match="no JSON lines"):
        check_jsonl(io.BytesIO(b"\n \n"), 1_000)
    with pytest.raises(PayloadTooLarge):
        check_jsonl(io.BytesIO(b'{"a": "' + b"x" * 2_000 + b'"}\n'), 1_000)


def test_a_long_file_is_read_in_pieces_and_every_line_is_checked() -> None:
    lines = [orjson.dumps({"i": i, "pad": "y" * 300}) for i in range(10_000)]  # ~3 MB
    raw = b"\n".join(lines) + b"\n"
    assert check_jsonl(io.BytesIO(raw), 1_000) == 10_000
    broken = raw[: len(raw) // 2] + b"oops\n" + raw[len(raw) // 2 :]
    with pytest.raises(InvalidInput, match="line"):
        check_jsonl(io.BytesIO(broken), 1_000)


@FAST
@given(raw=st.binary(max_size=2_000))
def test_random_bytes_are_refused_or_are_jsonl(raw: bytes) -> None:
    try:
        n = check_jsonl(io.BytesIO(raw), 500)
    except (InvalidInput, PayloadTooLarge):
        return
    objects = [x for x in raw.split(b"\n") if x.strip()]
    assert n == len(objects) and all(isinstance(orjson.loads(x), dict) for x in objects)
