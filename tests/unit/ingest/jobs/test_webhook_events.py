"""ingest/webhook_events.py: a delivery verifies with the receivers' own tools - the
OpenAI SDK's ``webhooks`` and the ``standardwebhooks`` library - and with the
deprecated header; OpenAI's batch event parses as the SDK's own type."""

from __future__ import annotations

import base64
import time
import uuid
from datetime import UTC, datetime

import openai
import orjson
import pytest
import standardwebhooks
from hypothesis import given
from hypothesis import strategies as st

from ingest.jobs import webhook_events as ev

JOB = str(uuid.uuid4())
FINISHED = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def _sdk() -> openai.OpenAI:
    return openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1")


def _delivery(secret: str, content: dict[str, object]) -> tuple[bytes, dict[str, str]]:
    body = orjson.dumps(content)
    return body, ev.headers(secret, ev.event_id(JOB), int(time.time()), body)


def test_a_new_secret_is_whsec_and_32_bytes_of_base64() -> None:
    secret = ev.new_secret()
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret[6:], validate=True)) == 32
    assert ev.new_secret() != secret


def test_the_openai_sdk_unwraps_a_batch_event_as_its_own_type() -> None:
    secret = ev.new_secret()
    body, headers = _delivery(secret, ev.batch_event(JOB, "batch_x", "completed", FINISHED))
    event = _sdk().webhooks.unwrap(body, headers, secret=secret)
    assert event.type == "batch.completed" and event.data.id == "batch_x"
    assert event.id == ev.event_id(JOB) and event.created_at == int(FINISHED.timestamp())
    assert type(event).__name__ == "BatchCompletedWebhookEvent"


@pytest.mark.parametrize("status", ["completed", "expired", "cancelled"])
def test_each_terminal_batch_status_is_an_event_the_sdk_knows(status: str) -> None:
    secret = ev.new_secret()
    body, headers = _delivery(secret, ev.batch_event(JOB, "batch_y", status, FINISHED))
    event = _sdk().webhooks.unwrap(body, headers, secret=secret)
    assert event.type == f"batch.{status}"
    assert type(event).__name__ != "dict"


def test_standardwebhooks_verifies_a_job_event() -> None:
    secret = ev.new_secret()
    counts = {"total": 2, "succeeded": 2, "failed": 0, "expired": 0, "cancelled": 0}
    body, headers = _delivery(secret, ev.job_event(JOB, "completed", counts, FINISHED))
    got = standardwebhooks.Webhook(secret).verify(body, headers)
    assert got["job_id"] == JOB and got["status"] == "completed" and got["counts"] == counts
    _sdk().webhooks.verify_signature(body, headers, secret=secret)


def test_a_wrong_secret_a_changed_body_or_another_id_is_refused() -> None:
    secret = ev.new_secret()
    body, headers = _delivery(secret, ev.batch_event(JOB, "batch_z", "completed", FINISHED))
    sdk = _sdk()
    with pytest.raises(openai.InvalidWebhookSignatureError):
        sdk.webhooks.verify_signature(body, headers, secret=ev.new_secret())
    with pytest.raises(openai.InvalidWebhookSignatureError):
        sdk.webhooks.verify_signature(body + b" ", headers, secret=secret)
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(secret).verify(body, {**headers, "webhook-id": "evt_other"})


def test_an_old_delivery_is_refused_by_the_receivers_tolerance() -> None:
    secret = ev.new_secret()
    body = b'{"type": "job.finished"}'
    old = ev.headers(secret, ev.event_id(JOB), int(time.time()) - 3600, body)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        _sdk().webhooks.verify_signature(body, old, secret=secret)


def test_the_deprecated_header_still_verifies() -> None:
    secret = ev.new_secret()
    body, headers = _delivery(secret, {"type": "job.finished"})
    now = int(time.time())
    assert ev.legacy_verify(secret, body, headers[ev.LEGACY_SIGNATURE_HEADER], now)
    assert not ev.legacy_verify("whsec_wrong", body, headers[ev.LEGACY_SIGNATURE_HEADER], now)
    assert not ev.legacy_verify(secret, body, headers[ev.LEGACY_SIGNATURE_HEADER], now + 3600)
    assert not ev.legacy_verify(secret, body, "garbage", now)


def test_a_secret_issued_before_standard_webhooks_still_signs_the_legacy_header() -> None:
    old_secret = "whsec_" + "Ab-_" * 8  # token_urlsafe's alphabet: not base64
    body = b"{}"
    h = ev.headers(old_secret, ev.event_id(JOB), int(time.time()), body)
    assert ev.legacy_verify(old_secret, body, h[ev.LEGACY_SIGNATURE_HEADER], int(time.time()))
    assert h["webhook-signature"].startswith("v1,")


def test_every_retry_of_one_event_carries_the_same_id() -> None:
    assert ev.event_id(JOB) == ev.event_id(JOB) == "evt_" + uuid.UUID(JOB).hex
    assert ev.event_id(JOB) != ev.event_id(str(uuid.uuid4()))


@given(st.text(max_size=512), st.integers(min_value=0, max_value=2**36))
def test_any_body_is_signed_as_the_library_signs_it(text: str, ts: int) -> None:
    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()
    h = ev.standard_headers(secret, "evt_1", ts, text.encode())
    expected = standardwebhooks.Webhook(secret).sign("evt_1", datetime.fromtimestamp(ts, UTC), text)
    assert h["webhook-signature"] == expected and h["webhook-timestamp"] == str(ts)
