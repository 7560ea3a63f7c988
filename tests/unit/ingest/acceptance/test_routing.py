"""Which version answers a request (ingest/acceptance/routing.py): pins, the live version, canary
shares sticky per caller, and honest 503s."""

from __future__ import annotations

import pytest

from core.errors import NotFound, Unavailable
from core.models.registry import VersionRecord, VersionState
from ingest.acceptance.routing import (
    LOADING_RETRY_S,
    STICKY_IDEMPOTENCY_KEY,
    ModelRoutes,
    RouteTable,
    Served,
    bucket,
    choose,
    lookup,
    open_versions,
)

S = VersionState
READY = Served(ready=1)


def table(
    *records: VersionRecord,
    served: dict[str, Served] | None = None,
    sticky: str = "tenant",
) -> RouteTable:
    routes = ModelRoutes("m", {r.version: r for r in records}, sticky)
    ready = {("m", r.version): READY for r in records}
    for v, s in (served or {}).items():
        ready[("m", v)] = s
    return RouteTable({"m": routes}, ready)


def rec(version: str, state: VersionState, share: float = 0.0) -> VersionRecord:
    return VersionRecord("m", version, "sim", 8, state=state, canary_share=share)


def test_a_bare_name_goes_to_the_live_version_and_a_pin_to_its_own() -> None:
    t = table(rec("1", S.LIVE), rec("2", S.STAGED))
    assert choose(t, "m", "", tenant_id="t").version == "1"
    d = choose(t, "m", "2", tenant_id="t")
    assert (d.version, d.reason) == ("2", "pinned")


def test_unknown_and_retired_versions_are_404s_naming_what_exists() -> None:
    t = table(rec("1", S.LIVE), rec("2", S.RETIRED))
    with pytest.raises(NotFound, match="retired"):
        choose(t, "m", "2", tenant_id="t")
    with pytest.raises(NotFound, match=r"does not exist \(versions: 1\)"):
        choose(t, "m", "7", tenant_id="t")
    with pytest.raises(NotFound, match="unknown model 'x'"):
        choose(t, "x", "", tenant_id="t")


def test_the_canary_gets_its_share_of_callers() -> None:
    t = table(rec("1", S.LIVE), rec("2", S.CANARY, 0.10))
    got = [choose(t, "m", "", tenant_id=f"tenant-{i}").version for i in range(4000)]
    share = got.count("2") / len(got)
    assert 0.085 < share < 0.115


def test_a_caller_sees_one_version_for_the_canarys_life() -> None:
    t = table(rec("1", S.LIVE), rec("2", S.CANARY, 0.5))
    for i in range(50):
        first = choose(t, "m", "", tenant_id=f"t{i}").version
        assert all(choose(t, "m", "", tenant_id=f"t{i}").version == first for _ in range(5))


def test_raising_the_share_keeps_the_callers_already_in() -> None:
    small = table(rec("1", S.LIVE), rec("2", S.CANARY, 0.05))
    large = table(rec("1", S.LIVE), rec("2", S.CANARY, 0.20))
    tenants = [f"t{i}" for i in range(2000)]
    before = {t for t in tenants if choose(small, "m", "", tenant_id=t).version == "2"}
    after = {t for t in tenants if choose(large, "m", "", tenant_id=t).version == "2"}
    assert before and before <= after and len(after) > 2 * len(before)


def test_each_new_canary_draws_its_own_cohort() -> None:
    a = {f"t{i}" for i in range(2000) if bucket("m", "2", f"tenant\x00t{i}") < 0.1}
    b = {f"t{i}" for i in range(2000) if bucket("m", "3", f"tenant\x00t{i}") < 0.1}
    assert a != b and len(a & b) < len(a) / 3


def test_sticky_per_idempotency_key_spreads_one_tenant() -> None:
    t = table(rec("1", S.LIVE), rec("2", S.CANARY, 0.5), sticky=STICKY_IDEMPOTENCY_KEY)
    got = {choose(t, "m", "", tenant_id="one", idempotency_key=f"k{i}").version for i in range(40)}
    assert got == {"1", "2"}
    # Without a key, the tenant decides.
    assert len({choose(t, "m", "", tenant_id="one").version for _ in range(10)}) == 1


def test_jobs_get_no_canary() -> None:
    t = table(rec("1", S.LIVE), rec("2", S.CANARY, 1.0))
    assert choose(t, "m", "", tenant_id=None).version == "1"
    assert choose(t, "m", "", tenant_id="any").version == "2"


def test_lookup_answers_from_the_registry_whether_or_not_a_worker_serves() -> None:
    # Metadata (KServe v2) names versions nobody serves yet; a retired one is a 404.
    t = table(rec("1", S.LIVE), rec("2", S.STAGED), rec("3", S.RETIRED), served={"1": Served()})
    assert lookup(t, "m", "").version == "1"
    assert lookup(t, "m", "2").version == "2"
    assert open_versions(t.models["m"]) == ["1", "2"]
    with pytest.raises(NotFound, match=r"'m@3' is retired \(versions: 1, 2\)"):
        lookup(t, "m", "3")
    with pytest.raises(Unavailable):
        choose(t, "m", "", tenant_id="t")  # served by nobody: 503, not 404


def test_a_canary_no_worker_serves_leaves_its_share_on_the_live_version() -> None:
    t = table(rec("1", S.LIVE), rec("2", S.CANARY, 1.0), served={"2": Served(loading=1)})
    d = choose(t, "m", "", tenant_id="t")
    assert (d.version, d.reason) == ("1", "live (canary not ready)")


def test_loading_is_a_503_with_retry_after_only_when_nothing_can_serve() -> None:
    t = table(rec("1", S.LIVE), served={"1": Served(loading=2)})
    with pytest.raises(Unavailable, match="loading") as e:
        choose(t, "m", "", tenant_id="t")
    assert e.value.retry_after_s == LOADING_RETRY_S
    both = table(rec("1", S.LIVE), served={"1": Served(ready=1, loading=1)})
    assert choose(both, "m", "", tenant_id="t").version == "1"


def test_an_unreachable_upstream_gives_the_circuits_time_left_and_not_its_text() -> None:
    why = "http://svc:s3cret@10.0.0.7:8080/predict is down: ConnectError: refused"
    down = Served(unavailable=1, error=why, retry_after_s=3.2)
    t = table(rec("1", S.LIVE), served={"1": down})
    with pytest.raises(Unavailable, match="cannot be reached") as e:
        choose(t, "m", "1", tenant_id="t")
    assert e.value.retry_after_s == 3.2
    assert "s3cret" not in e.value.message and "10.0.0.7" not in e.value.message


def test_a_failed_verification_is_a_503_without_a_promise_or_the_workers_text() -> None:
    bad = Served(failed=1, error="sha256 mismatch for /srv/models/m.bin")
    t = table(rec("1", S.LIVE), rec("2", S.STAGED), served={"2": bad})
    with pytest.raises(Unavailable, match="failed to load") as e:
        choose(t, "m", "2", tenant_id="t")
    assert e.value.retry_after_s is None and "/srv" not in e.value.message


def test_no_live_version_asks_for_a_pin() -> None:
    t = table(rec("1", S.STAGED))
    with pytest.raises(NotFound, match="no live version"):
        choose(t, "m", "", tenant_id="t")
