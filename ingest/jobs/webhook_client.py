"""Sending one webhook: to a checked address, within one deadline, reading a bounded
answer, and telling the outcome as a status class (decision 27).

The connection goes to the address that was just resolved and checked, never to a
name resolved again by the HTTP library: a name whose DNS answer changes between the
check and the connect (DNS rebinding) reaches nothing internal. TLS still verifies
the certificate against the name (SNI and the Host header carry the name).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import httpcore

from ingest.jobs.destinations import AllowList, IPAddress, literal_ip

# What a tenant sees of a failed delivery: one of these, never an exception's text.
TIMEOUT = "timeout"
REFUSED_DESTINATION = "refused_destination"
DNS_ERROR = "dns_error"
CONNECT_ERROR = "connect_error"
TLS_ERROR = "tls_error"
PROTOCOL_ERROR = "protocol_error"

Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]


class RefusedDestination(Exception):
    """The destination resolved to an address webhooks may not reach."""


class NotResolved(Exception):
    """The destination's name has no address."""


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to (a literal resolves to itself)."""
    ip = literal_ip(host)
    if ip is not None:
        return [ip]
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise NotResolved(host) from exc
    out: list[IPAddress] = []
    for info in infos:
        addr = literal_ip(str(info[4][0]).split("%", 1)[0])
        if addr is not None and addr not in out:
            out.append(addr)
    return out


class CheckedBackend(httpcore.AsyncNetworkBackend):
    """A network backend that resolves the name itself, refuses any internal address
    the allow-list does not permit, and connects to the checked address."""

    def __init__(
        self,
        allow: AllowList,
        resolver: Resolver = resolve,
        inner: httpcore.AsyncNetworkBackend | None = None,
    ):
        self._allow = allow
        self._resolve = resolver
        self._inner = inner or httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = await self._resolve(host, port)
        if not addresses:
            raise NotResolved(host)
        for ip in addresses:
            if self._allow.refusal(ip) is not None:
                raise RefusedDestination(f"{host} resolves to {ip}")
        return await self._inner.connect_tcp(
            str(addresses[0]),
            port,
            timeout=timeout,
            local_address=local_address,
            socket_options=socket_options,
        )

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise RefusedDestination("unix sockets are not webhook destinations")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def new_pool(allow: AllowList, resolver: Resolver = resolve) -> httpcore.AsyncConnectionPool:
    """No connection is kept alive: every delivery resolves and checks afresh."""
    return httpcore.AsyncConnectionPool(
        ssl_context=ssl.create_default_context(),
        max_keepalive_connections=0,
        network_backend=CheckedBackend(allow, resolver),
    )


def status_class(status: int) -> str | None:
    """None for a 2xx answer (delivered), else "http_3xx" / "http_4xx" / "http_5xx"
    (redirects are not followed: a redirect could point anywhere)."""
    if 200 <= status < 300:
        return None
    return f"http_{min(max(status // 100, 1), 5)}xx"


def failure_class(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | httpcore.TimeoutException):
        return TIMEOUT
    if isinstance(exc, RefusedDestination):
        return REFUSED_DESTINATION
    if isinstance(exc, NotResolved):
        return DNS_ERROR
    if isinstance(exc, httpcore.ConnectError):
        return TLS_ERROR if isinstance(exc.__cause__, ssl.SSLError) else CONNECT_ERROR
    return PROTOCOL_ERROR


async def post(
    pool: httpcore.AsyncConnectionPool,
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    deadline_s: float,
    max_response_bytes: int,
) -> str | None:
    """POST ``body``; None when the receiver answered 2xx, else the failure's class.
    ``deadline_s`` bounds the whole delivery (resolve, connect, TLS, send, answer): a
    receiver that trickles its answer a byte at a time cannot hold it longer. At most
    ``max_response_bytes`` of the answer are read; the rest is dropped with the
    connection."""
    try:
        async with (
            asyncio.timeout(deadline_s),
            pool.stream(
                "POST",
                url,
                headers=[*headers.items(), ("Content-Length", str(len(body)))],
                content=body,
            ) as response,
        ):
            read = 0
            async for chunk in response.aiter_stream():
                read += len(chunk)
                if read >= max_response_bytes:
                    break
            return status_class(response.status)
    except (
        TimeoutError,
        RefusedDestination,
        NotResolved,
        httpcore.TimeoutException,
        httpcore.NetworkError,
        httpcore.ProtocolError,
        httpcore.UnsupportedProtocol,
    ) as exc:
        return failure_class(exc)
