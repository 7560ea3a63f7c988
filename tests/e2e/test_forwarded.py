"""X-Forwarded-For is believed only from the proxies in GRISTMILL_FORWARDED_ALLOW_IPS,
and the log of refused requests names the address it believed: an operator looking for a
hostile caller finds the caller, not an address the caller made up."""

from __future__ import annotations

import time

import httpx

from gristmill.devservices.stack import System

CLAIMED = "203.0.113.7"  # TEST-NET-3: an address the caller claims to have


def refusal_lines(system: System, name: str, timeout_s: float = 10) -> list[str]:
    path = system.workdir / f"{name}.log"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = [ln for ln in path.read_text().splitlines() if "refused 401" in ln]
        if lines:
            return lines
        time.sleep(0.1)
    raise AssertionError(f"no refusal logged by {name}: {path.read_text()[-2000:]}")


def test_x_forwarded_for_is_believed_only_from_a_configured_proxy(system: System) -> None:
    # Both started as a deployment starts them (`gristmill api`), reading the setting.
    direct = system.start_api("api-direct", cli=True, env={"GRISTMILL_FORWARDED_ALLOW_IPS": ""})
    proxied = system.start_api(
        "api-proxied", cli=True, env={"GRISTMILL_FORWARDED_ALLOW_IPS": "127.0.0.0/8"}
    )
    try:
        claim = {"X-Forwarded-For": CLAIMED, "Authorization": "Bearer gm_made_up_key"}
        for url in (direct, proxied):
            r = httpx.post(f"{url}/v1/infer", json={"model": "sim", "input": "x"}, headers=claim)
            assert r.status_code == 401, r.text
        # The peer (127.0.0.1) is no configured proxy: its claim is not believed.
        untrusted = refusal_lines(system, "api-direct")
        assert len(untrusted) == 1, untrusted
        assert untrusted[0].endswith("refused 401 POST '/v1/infer' from 127.0.0.1"), untrusted
        assert CLAIMED not in untrusted[0]
        # The peer is a configured proxy: the address it forwards is the client's.
        trusted = refusal_lines(system, "api-proxied")
        assert len(trusted) == 1, trusted
        assert trusted[0].endswith(f"refused 401 POST '/v1/infer' from {CLAIMED}"), trusted
    finally:
        system.stop_many(["api-direct", "api-proxied"])
