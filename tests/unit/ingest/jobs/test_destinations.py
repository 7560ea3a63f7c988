"""Where webhooks may go: address classification and URL checks (pure)."""

from __future__ import annotations

from ipaddress import ip_address

import pytest

from core.errors import InvalidInput
from ingest.jobs.destinations import (
    MAX_URL_CHARS,
    AllowList,
    check_addresses,
    internal_reason,
    literal_ip,
    parse_destination,
)


@pytest.mark.parametrize(
    "addr,why",
    [
        ("127.0.0.1", "loopback"),
        ("127.255.1.2", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),  # the cloud metadata service
        ("100.64.0.1", "shared"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),
        ("192.0.2.10", "documentation"),
        ("198.18.0.1", "reserved"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fe80::1", "link-local"),
        ("fc00::1", "private"),
        ("fd12:3456::1", "private"),
        ("ff02::1", "multicast"),
        ("2001:db8::1", "documentation"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
        ("::ffff:169.254.169.254", "link-local"),
        ("::ffff:10.0.0.1", "private"),
        ("64:ff9b::7f00:1", "loopback"),  # NAT64 of 127.0.0.1
        ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 of 169.254.169.254
        ("2002:7f00:1::1", "loopback"),  # 6to4 of 127.0.0.1
        ("2002:c0a8:101::1", "private"),  # 6to4 of 192.168.1.1
        ("2001::1", "reserved"),  # Teredo
        ("::127.0.0.1", "reserved"),  # IPv4-compatible (deprecated)
        ("4000::1", "reserved"),  # outside 2000::/3
    ],
)
def test_internal_addresses_are_named(addr: str, why: str) -> None:
    assert internal_reason(ip_address(addr)) == why


@pytest.mark.parametrize(
    "addr",
    [
        "8.8.8.8",
        "1.1.1.1",
        "93.184.216.34",
        "172.32.0.1",
        "100.128.0.1",
        "2606:4700::1111",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
        "2002:808:808::1",
    ],
)
def test_public_addresses_pass(addr: str) -> None:
    assert internal_reason(ip_address(addr)) is None


@pytest.mark.parametrize(
    "host,addr",
    [
        ("127.0.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),  # decimal
        ("017700000001", "127.0.0.1"),  # octal, one part
        ("0177.0.0.1", "127.0.0.1"),  # octal, dotted
        ("0x7f.0.0.1", "127.0.0.1"),  # hex
        ("0x7f000001", "127.0.0.1"),
        ("127.1", "127.0.0.1"),  # short form
        ("0", "0.0.0.0"),
        ("0xa9.0xfe.0xa9.0xfe", "169.254.169.254"),
        ("[::1]", "::1"),
        ("::ffff:7f00:1", "::ffff:127.0.0.1"),
    ],
)
def test_literal_ip_reads_every_form_the_resolver_reads(host: str, addr: str) -> None:
    ip = literal_ip(host)
    assert ip == ip_address(addr)
    assert ip is not None and internal_reason(ip) is not None


@pytest.mark.parametrize("host", ["example.com", "localhost", "deadbeef.example", "1.2.3.4.5"])
def test_names_are_not_literals(host: str) -> None:
    assert literal_ip(host) is None


def test_allow_list_permits_only_its_networks() -> None:
    allow = AllowList.parse(["127.0.0.0/8", "::1/128"])
    assert allow.refusal(ip_address("127.0.0.1")) is None
    assert allow.refusal(ip_address("::ffff:127.0.0.1")) is None
    assert allow.refusal(ip_address("::1")) is None
    assert allow.refusal(ip_address("10.0.0.1")) == "private"
    assert allow.refusal(ip_address("169.254.169.254")) == "link-local"
    assert AllowList().refusal(ip_address("127.0.0.1")) == "loopback"
    assert AllowList().refusal(ip_address("8.8.8.8")) is None


@pytest.mark.parametrize(
    "url,fragment",
    [
        ("ftp://example.com/x", "http(s)"),
        ("http://exa\x00mple.com/", "control"),
        ("http://example.com/\x00", "control"),
        ("http://example.com/ x", "spaces"),
        ("http://example.com/\ud800", "surrogate"),
        ("http:///path", "no host"),
        ("http://user:pw@example.com/", "credentials"),
        ("http://example.com:99999/", "not a valid URL"),
        ("https://" + "a" * MAX_URL_CHARS + ".com/", "at most"),
        ("javascript:alert(1)", "http(s)"),
    ],
)
def test_bad_urls_are_400_naming_the_field(url: str, fragment: str) -> None:
    with pytest.raises(InvalidInput) as e:
        parse_destination(url)
    assert e.value.field == "webhook_url" and fragment in e.value.message


def test_a_url_keeps_its_name_for_host_and_sni() -> None:
    d = parse_destination("https://Hooks.Example.com/x?y=1")
    assert (d.scheme, d.host, d.port) == ("https", "hooks.example.com", 443)
    assert parse_destination("http://bücher.example/").host == "xn--bcher-kva.example"
    assert parse_destination("http://[::1]:8080/").port == 8080


def test_one_internal_address_among_public_ones_refuses() -> None:
    d = parse_destination("https://hooks.example.com/")
    allow = AllowList()
    check_addresses(d, [ip_address("93.184.216.34")], allow)
    with pytest.raises(InvalidInput, match="loopback"):
        check_addresses(d, [ip_address("93.184.216.34"), ip_address("127.0.0.1")], allow)
    with pytest.raises(InvalidInput, match="does not resolve"):
        check_addresses(d, [], allow)
