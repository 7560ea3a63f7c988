"""The HTTP tier and its edge (ingest/)."""

from __future__ import annotations

import ipaddress
from typing import Self

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from core.config._base import PositiveMs, _check_not_above, _Concern


class ApiSettings(_Concern):
    """The HTTP tier (ingest/)."""

    api_host: str = "127.0.0.1"
    api_port: int = Field(8000, ge=1, le=65_535)
    # KServe's open inference protocol over gRPC (decision 57): each API process serves
    # it on this port too (SO_REUSEPORT: several processes share it), on ``api_host``.
    # 0: off.
    grpc_port: int = Field(0, ge=0, le=65_535)
    # uvicorn processes `gristmill dev`, `gristmill api` and the peer benchmark start: one
    # event loop saturates a core near 1,000 req/s (docs/bench/README.md).
    api_processes: int = Field(2, ge=1)
    # Each API process accepts on a socket of its own (SO_REUSEPORT, Linux), so the
    # kernel spreads connections evenly; false: uvicorn's one shared socket. Off: on a GPU
    # host it was no better (decision 73, r15).
    api_own_sockets: bool = False
    max_body_bytes: int = Field(1_000_000, gt=0)
    # A request's deadline when the caller gives no timeout_ms and its tier has no SLO
    # (tier_slo_ms); past it the caller gets 504 and compute is skipped.
    default_timeout_ms: PositiveMs = 10_000
    max_timeout_ms: PositiveMs = 300_000
    # Kafka must have the message within this long, else the API answers 503.
    produce_timeout_ms: PositiveMs = 5_000
    # How long a found API key is cached while the revocation listener is up.
    auth_cache_s: float = Field(10.0, ge=0)
    # Fallback poll of the result store when a NOTIFY may have been missed.
    result_poll_interval_ms: PositiveMs = 500
    idempotency_ttl_h: int = Field(24, gt=0)
    # Requests one API instance holds at once (each tier may use inflight_share of it).
    max_inflight: int = Field(1000, ge=1)
    # Streamed answers one API instance (all its processes) holds open at once; a key's
    # own share is tier_max_streams.
    max_streams: int = Field(1000, ge=1)
    # Flex calls one API instance process holds open waiting for their answers, apart
    # from max_inflight (decision 66): past it a flex call is answered 202 as soon as
    # Kafka has it, never refused.
    max_flex_waits: int = Field(1000, ge=0)
    # API instances and schedulers report every second; older reports are ignored.
    load_report_stale_s: float = Field(5.0, gt=0)
    # Proxies (comma-separated addresses or CIDRs, "*" for any) whose X-Forwarded-For and
    # X-Forwarded-Proto are believed; empty: none. TLS ends at the ingress, which must be
    # listed here for the client's own address to be seen.
    forwarded_allow_ips: str = ""

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _proxy_addresses(cls, value: str) -> str:
        # uvicorn would take a mistyped address as a literal that never matches: refuse it.
        for entry in (e.strip() for e in value.split(",") if e.strip()):
            if entry == "*":
                continue
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address, a CIDR or *") from None
        return value

    @model_validator(mode="after")
    def _timeouts(self) -> Self:
        _check_not_above(self, ("default_timeout_ms", "max_timeout_ms"))
        return self


class EdgeSettings(_Concern):
    """What one request may carry and how API keys are checked (core/limits.py,
    ingest/native/wire.py, ingest/edge/auth.py). The caps and why they sit where they do:
    docs/decisions/0025-edge-validation-caps-and-error-mapping.md."""

    # A model reference ("name" or "name@version"); echoed in errors, never stored.
    max_model_chars: int = Field(200, ge=1, le=1_000)
    # The whole params object as JSON, checked before a model looks at it.
    max_params_bytes: int = Field(4_096, ge=2)
    # Nesting of any free-form JSON value: orjson writes at most 254 levels.
    max_json_depth: int = Field(32, ge=1, le=250)
    # Idempotency-Key: part of a primary key (btree entries stop near 2,700 bytes).
    max_idempotency_key_chars: int = Field(255, ge=1, le=1_000)
    # timeout_ms below this is refused (400); the upper bound is max_timeout_ms.
    min_timeout_ms: int = Field(1, ge=1)
    # A request body (not a job upload) must have arrived this long after it began (s),
    # else 408: max_body_bytes (1 MB) takes 8 s at 1 Mbit/s.
    body_timeout_s: float = Field(10.0, gt=0)
    # API keys remembered per process (LRU), found and not found, and for how long a
    # "not found" is trusted (s).
    auth_cache_size: int = Field(10_000, ge=1)
    auth_negative_cache_size: int = Field(10_000, ge=0)
    auth_negative_ttl_s: float = Field(1.0, ge=0)
    # A revoked key stops working on every API instance within this long (s): the
    # revocation NOTIFY normally takes milliseconds; while the listener is down cached
    # keys are trusted no longer than this.
    auth_revocation_s: float = Field(2.0, gt=0)
    # Key lookups one API process runs against PostgreSQL at once; a flood of unknown
    # keys queues here instead of taking every pooled connection.
    auth_max_lookups: int = Field(4, ge=1)
    # /readyz answers from a check this old at most (s).
    readyz_refresh_s: float = Field(1.0, gt=0)
