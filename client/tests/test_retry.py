"""The client's retry policy (shared by the sync and async clients)."""

from __future__ import annotations

import httpx
from gristmill_client.client import _backoff, retry_delay_s


def resp(status: int, retry_after: str | None = None) -> httpx.Response:
    headers = {"Retry-After": retry_after} if retry_after else {}
    return httpx.Response(status, headers=headers)


def test_retry_after_is_honoured() -> None:
    assert _backoff(resp(503, "7"), 0, 3) == 7.0
    assert retry_delay_s(resp(429, "2"), 5) == 2.0


def test_client_errors_and_success_are_final() -> None:
    assert _backoff(resp(200), 0, 3) is None
    assert _backoff(resp(400), 0, 3) is None
    assert _backoff(resp(500), 0, 3) is None


def test_transport_errors_back_off_until_the_last_attempt() -> None:
    delay = _backoff(None, 2, 3)
    assert delay is not None and 0 <= delay <= 0.25 * 2**2
    assert _backoff(None, 3, 3) is None
    assert _backoff(resp(503, "1"), 3, 3) is None
