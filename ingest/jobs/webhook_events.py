"""What a webhook carries and how it is signed. Pure: no I/O, the time passed in.

Signed by the Standard Webhooks specification (decision 53), as OpenAI and Gemini sign
theirs, so a receiver verifies with what it already has - ``client.webhooks.unwrap()``
of the OpenAI SDK, or the ``standardwebhooks`` library of any language:

    webhook-id: evt_<32 hex>            the same on every retry of one event
    webhook-timestamp: <unix seconds>
    webhook-signature: v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">

The key is the secret returned once at submission, ``whsec_<base64 of 32 bytes>``,
decoded. ``Gristmill-Signature: t=..,v1=..`` (HMAC of "<t>.<body>" keyed by the secret
string itself) is still sent for one release and is deprecated.

A Batch-API batch's event is OpenAI's (``batch.completed``, ``batch.expired``,
``batch.cancelled``; ``batch.failed`` is never sent: a batch whose file is invalid is
refused when created, and one whose items all failed is a completed batch with an error
file, as at OpenAI). A job's event is Gristmill's ``job.finished``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import uuid
from datetime import datetime
from typing import Any

SECRET_PREFIX = "whsec_"
# Deprecated (decision 53): kept for one release beside the Standard Webhooks headers.
LEGACY_SIGNATURE_HEADER = "Gristmill-Signature"


def new_secret() -> str:
    """A secret every Standard Webhooks library reads: the prefix, then base64 of 32
    random bytes (the key)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def signing_key(secret: str) -> bytes:
    """The HMAC key, decoded as the OpenAI SDK and the standardwebhooks library decode
    it. A secret issued before decision 53 (not base64 after its prefix) signs with its
    own bytes; receivers verify those by the legacy header."""
    if secret.startswith(SECRET_PREFIX):
        try:
            return base64.b64decode(secret[len(SECRET_PREFIX) :])
        except (binascii.Error, ValueError):
            pass
    return secret.encode()


def event_id(job_id: str) -> str:
    """One terminal event per job: its id is the job's, so every retry carries the same
    ``webhook-id`` and a receiver drops duplicates by it."""
    return "evt_" + uuid.UUID(job_id).hex


def standard_headers(secret: str, msg_id: str, ts: int, body: bytes) -> dict[str, str]:
    signed = f"{msg_id}.{ts}.".encode() + body
    mac = hmac.new(signing_key(secret), signed, hashlib.sha256).digest()
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": "v1," + base64.b64encode(mac).decode(),
    }


def legacy_sign(secret: str, body: bytes, ts: int) -> str:
    mac = hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={ts},v1={mac}"


def legacy_verify(secret: str, body: bytes, header: str, now: int, tolerance_s: int = 300) -> bool:
    try:
        parts = dict(p.split("=", 1) for p in header.split(","))
        ts = int(parts["t"])
    except (ValueError, KeyError):
        return False
    if abs(now - ts) > tolerance_s:
        return False
    return hmac.compare_digest(legacy_sign(secret, body, ts), header)


def headers(secret: str, msg_id: str, ts: int, body: bytes) -> dict[str, str]:
    """Every header a delivery carries."""
    return {
        "Content-Type": "application/json",
        **standard_headers(secret, msg_id, ts, body),
        LEGACY_SIGNATURE_HEADER: legacy_sign(secret, body, ts),
    }


def job_event(
    job_id: str, status: str, counts: dict[str, int], finished_at: datetime
) -> dict[str, Any]:
    return {
        "id": event_id(job_id),
        "type": "job.finished",
        "job_id": job_id,
        "status": status,
        "counts": counts,
        "finished_at": finished_at.isoformat(),
    }


def batch_event(
    job_id: str, batch_id: str, job_status: str, finished_at: datetime
) -> dict[str, Any]:
    """OpenAI's event body for a batch whose job ended in ``job_status``: a job whose
    items all failed is a completed batch with an error file, as at OpenAI."""
    status = "completed" if job_status == "failed" else job_status
    return {
        "id": event_id(job_id),
        "object": "event",
        "created_at": int(finished_at.timestamp()),
        "type": f"batch.{status}",
        "data": {"id": batch_id},
    }
