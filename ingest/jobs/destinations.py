"""Where a webhook may be sent: public addresses only, unless an operator allows a
network (decision 27). Pure: no resolution happens here; callers pass what a name
resolved to.

A tenant must not be able to make our servers reach what only they can reach: the
loopback interface, the cloud metadata service (169.254.169.254), the private
network the API runs in. So every address a destination resolves to is classified
against the IANA special-purpose registries, at submission and again at connect
time (ingest/jobs/webhook_client.py), and any internal one refuses the destination.
"""

from __future__ import annotations

import ipaddress
import socket
import string
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_network
from urllib.parse import urlsplit

from core.errors import InvalidInput
from core.limits import check_text

IPAddress = IPv4Address | IPv6Address

# Longer URLs are not webhook endpoints; 2,048 characters is what browsers and most
# HTTP servers reliably accept in a request line.
MAX_URL_CHARS = 2048

# (network, why it is internal): IANA IPv4 and IPv6 special-purpose address registries.
_SPECIAL = tuple(
    (ip_network(n), why)
    for n, why in (
        ("0.0.0.0/8", "unspecified"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "shared"),  # carrier-grade NAT
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),  # cloud metadata services live here
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "reserved"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "reserved"),  # 6to4 relay anycast
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "reserved"),  # benchmarking
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),  # includes 255.255.255.255, broadcast
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("64:ff9b:1::/48", "private"),  # local-use NAT64
        ("100::/64", "reserved"),  # discard-only
        ("2001::/23", "reserved"),  # IETF protocol assignments, Teredo among them
        ("2001:db8::/32", "documentation"),
        ("3fff::/20", "documentation"),
        ("fc00::/7", "private"),  # unique local
        ("fe80::/10", "link-local"),
        ("fec0::/10", "private"),  # site-local (deprecated)
        ("ff00::/8", "multicast"),
    )
)
_GLOBAL_UNICAST_V6 = IPv6Network("2000::/3")
_NAT64 = IPv6Network("64:ff9b::/96")  # embeds an IPv4 address in its last 32 bits


def internal_reason(ip: IPAddress) -> str | None:
    """Why ``ip`` is not a public address (e.g. "loopback"), or None if it is one.
    IPv6 forms that carry an IPv4 address (mapped, NAT64, 6to4) are judged by it."""
    if isinstance(ip, IPv6Address):
        if ip.ipv4_mapped is not None:
            return internal_reason(ip.ipv4_mapped)
        if ip in _NAT64:
            return internal_reason(IPv4Address(int(ip) & 0xFFFF_FFFF))
        if ip.sixtofour is not None:
            return internal_reason(ip.sixtofour)
        why = _special(ip)
        if why is not None:
            return why
        # Outside 2000::/3 nothing is allocated for the public internet (IPv4-compatible
        # ::a.b.c.d among it).
        return None if ip in _GLOBAL_UNICAST_V6 else "reserved"
    return _special(ip)


def _special(ip: IPAddress) -> str | None:
    return next((why for net, why in _SPECIAL if ip.version == net.version and ip in net), None)


_INET_ATON_CHARS = frozenset(string.hexdigits + "xX.")


def literal_ip(host: str) -> IPAddress | None:
    """The address ``host`` spells, if it spells one: dotted quads and IPv6 (with or
    without brackets), and every form the C library's resolver also reads as IPv4:
    decimal (2130706433), octal (0177.0.0.1), hex (0x7f.1) and short (127.1)."""
    h = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(h)
    except ValueError:
        pass
    if h and set(h) <= _INET_ATON_CHARS:
        try:
            return IPv4Address(socket.inet_aton(h))
        except OSError:
            return None
    return None


@dataclass(frozen=True)
class AllowList:
    """Internal networks an operator lets webhooks reach (local development, a
    receiver inside the deployment's own network)."""

    networks: tuple[IPv4Network | IPv6Network, ...] = ()

    @classmethod
    def parse(cls, cidrs: list[str]) -> AllowList:
        return cls(tuple(ipaddress.ip_network(c, strict=False) for c in cidrs))

    def permits(self, ip: IPAddress) -> bool:
        mapped = ip.ipv4_mapped if isinstance(ip, IPv6Address) else None
        return any(ip in n or (mapped is not None and mapped in n) for n in self.networks)

    def refusal(self, ip: IPAddress) -> str | None:
        """Why a connection to ``ip`` is refused, or None when it may be made."""
        why = internal_reason(ip)
        return None if why is None or self.permits(ip) else why


@dataclass(frozen=True)
class Destination:
    url: str
    scheme: str
    host: str  # as it goes in the Host header and SNI (IDNA-encoded)
    port: int


def parse_destination(url: object, field: str = "webhook_url") -> Destination:
    """The URL's parts, or a 400 naming ``field``: an http(s) URL of at most
    MAX_URL_CHARS characters, with a host, without credentials or control characters."""
    if not isinstance(url, str):
        raise InvalidInput(f"{field} must be a string", field=field)
    if len(url) > MAX_URL_CHARS:
        raise InvalidInput(f"{field} may be at most {MAX_URL_CHARS} characters", field=field)
    if any(c <= " " or c == "\x7f" for c in url):
        raise InvalidInput(
            f"{field} must not contain spaces or control characters (NUL among them)", field=field
        )
    check_text(url, field)  # lone surrogates (core/limits.py)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidInput(f"{field} is not a valid URL: {exc}", field=field) from exc
    if parts.scheme not in ("http", "https"):
        raise InvalidInput(f"{field} must be an http(s) URL", field=field)
    if parts.username is not None or parts.password is not None:
        raise InvalidInput(f"{field} must not carry credentials; sign with the secret", field=field)
    host = parts.hostname or ""
    if not host:
        raise InvalidInput(f"{field} has no host", field=field)
    if literal_ip(host) is None:
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise InvalidInput(f"{field} has an invalid host name", field=field) from exc
    return Destination(url, parts.scheme, host, port or (443 if parts.scheme == "https" else 80))


def check_addresses(
    dest: Destination, addresses: list[IPAddress], allow: AllowList, field: str = "webhook_url"
) -> None:
    """400 unless ``dest`` resolved, and to public (or allowed) addresses only: one
    internal address among several refuses it (a name an attacker controls may
    answer with either)."""
    if not addresses:
        raise InvalidInput(f"{field}: host {dest.host} does not resolve", field=field)
    refused = [(ip, why) for ip in addresses if (why := allow.refusal(ip)) is not None]
    if refused:
        ip, why = refused[0]
        where = f"{field}: host {dest.host} resolves to {ip}, a {why} address"
        raise InvalidInput(f"{where}; webhooks may only reach public addresses", field=field)
