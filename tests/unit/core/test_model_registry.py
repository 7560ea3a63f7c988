"""Registry records, the specs they make, artifact digests and the lifecycle rules."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from core.config import Settings
from core.errors import Conflict, InvalidInput, NotFound
from core.models import lifecycle
from core.models.artifact import ArtifactError, artifact_bytes, artifact_sha256, verify
from core.models.causal_lm import CausalLMSpec
from core.models.embedding import EmbedSpec
from core.models.http import HttpSpec
from core.models.registry import (
    DEFAULT_WEIGHTS_NOISE,
    RecordError,
    VersionRecord,
    VersionState,
    builtin_records,
    new_record,
    spec_from_record,
    version_order,
)
from core.models.sim import SimSpec, sim_output

SETTINGS = Settings()
S = VersionState


def rec(version: str, state: VersionState = S.STAGED, share: float = 0.0) -> VersionRecord:
    return VersionRecord("m", version, "sim", 8, {}, state=state, canary_share=share)


def test_a_file_digest_is_its_sha256(tmp_path: Path) -> None:
    f = tmp_path / "w.bin"
    f.write_bytes(b"weights")
    assert artifact_sha256(f) == hashlib.sha256(b"weights").hexdigest()
    assert artifact_bytes(f) == 7


def test_a_directory_digest_changes_with_any_file_name_or_content(tmp_path: Path) -> None:
    d = tmp_path / "a"
    (d / "sub").mkdir(parents=True)
    (d / "x").write_text("1")
    (d / "sub" / "y").write_text("2")
    base = artifact_sha256(d)
    assert artifact_sha256(d) == base  # stable
    (d / "x").write_text("3")
    changed = artifact_sha256(d)
    assert changed != base
    (d / "x").rename(d / "z")
    assert artifact_sha256(d) not in (base, changed)


def test_verify_names_both_digests_on_a_mismatch(tmp_path: Path) -> None:
    f = tmp_path / "w"
    f.write_bytes(b"a")
    good = artifact_sha256(f)
    assert verify(f, good.upper()) == good
    with pytest.raises(ArtifactError) as e:
        verify(f, "0" * 64)
    assert "0" * 64 in str(e.value) and good in str(e.value)
    with pytest.raises(ArtifactError, match="does not exist"):
        artifact_sha256(tmp_path / "missing")


def test_each_backend_makes_its_spec() -> None:
    sim = spec_from_record(
        VersionRecord("s", "2", "sim", 16, {"batch_ms": 5, "variant": "b"}), SETTINGS
    )
    assert isinstance(sim, SimSpec) and sim.batch_ms == 5 and sim.variant == "b"
    emb = spec_from_record(
        VersionRecord("e", "2", "embedding", 64, {"max_tokens": 128}, "/w", "a" * 64), SETTINGS
    )
    assert isinstance(emb, EmbedSpec) and emb.max_tokens == 128 and emb.artifact == "/w"
    http = spec_from_record(
        VersionRecord(
            "h",
            "1",
            "http",
            32,
            {"url": "http://up/predict", "response_path": "result", "concurrency": 4},
        ),
        SETTINGS,
    )
    assert isinstance(http, HttpSpec) and http.concurrency == 4


@pytest.mark.parametrize(
    ("backend", "config", "match"),
    [
        ("onnx", {}, "unknown backend"),
        ("sim", {"batch_msec": 1}, "unknown config key 'batch_msec'"),
        ("embedding", {"max_tokens": 1000}, "max_tokens"),
        ("http", {"url": "ftp://x"}, "url"),
        ("http", {"url": "http://x", "request_template": {"q": "fixed"}}, "must use"),
        (
            "http",
            {"url": "http://x", "request_template": {"q": "{{input}}", "l": "{{params.lang}}"}},
            "not declared",
        ),
    ],
)
def test_a_record_no_spec_can_be_made_of_is_refused(backend: str, config: dict, match: str) -> None:
    with pytest.raises(RecordError, match=match):
        spec_from_record(VersionRecord("x", "1", backend, 4, config), SETTINGS)


def test_the_builtin_versions_are_live_and_make_the_catalog_specs() -> None:
    records = builtin_records(SETTINGS)
    assert {(r.name, r.version) for r in records} == {
        ("sim", "1"),
        ("all-minilm-l6-v2", "1"),
        ("gristmill-lm", "1"),
    }
    assert all(r.state is S.LIVE for r in records)
    lm = spec_from_record(next(r for r in records if r.name == "gristmill-lm"), SETTINGS)
    assert isinstance(lm, CausalLMSpec) and lm.context_length == 512
    sim = next(r for r in records if r.name == "sim")
    assert spec_from_record(sim, SETTINGS).batch_params({"salt": ""}) == (("salt", ""),)


def test_a_generation_version_is_registered_by_seed_or_artifact_for_gristmill_lm_only() -> None:
    seeded = new_record(
        "gristmill-lm@2",
        backend="causal-lm",
        max_batch_size=64,
        config={"weights_seed": 7},
        settings=SETTINGS,
    )
    spec = spec_from_record(seeded, SETTINGS)
    assert isinstance(spec, CausalLMSpec) and spec.weights_seed == 7
    assert spec.weights_noise == DEFAULT_WEIGHTS_NOISE
    plain = spec_from_record(
        new_record("gristmill-lm@3", backend="causal-lm", max_batch_size=64, settings=SETTINGS),
        SETTINGS,
    )
    assert isinstance(plain, CausalLMSpec) and plain.weights_seed is None
    with pytest.raises(InvalidInput) as e:
        new_record("my-lm@1", backend="causal-lm", max_batch_size=8, settings=SETTINGS)
    assert e.value.field == "backend" and "gristmill-lm" in str(e.value)
    for config in (
        {"weights_seed": -1},
        {"weights_seed": "7"},
        {"weights_seed": True},
        {"weights_seed": 1, "weights_noise": 0},
        {"weights_seed": 1, "weights_noise": 2},
        {"weights_sed": 1},
    ):
        with pytest.raises(InvalidInput) as e:
            new_record(
                "gristmill-lm@4",
                backend="causal-lm",
                max_batch_size=8,
                config=config,
                settings=SETTINGS,
            )
        assert e.value.field == "config", config
    with pytest.raises(InvalidInput) as e:  # weights from one place only
        new_record(
            "gristmill-lm@4",
            backend="causal-lm",
            max_batch_size=8,
            config={"weights_seed": 1},
            artifact="/srv/lm",
            sha256="a" * 64,
            settings=SETTINGS,
        )
    assert e.value.field == "config" and "not both" in str(e.value)


def test_a_variant_changes_every_sim_answer_and_no_variant_keeps_version_1s() -> None:
    assert sim_output("hello") == sim_output("hello", variant="")
    assert sim_output("hello")["digest"] != sim_output("hello", variant="2")["digest"]


def test_new_record_checks_names_digests_and_config() -> None:
    ok = new_record("my-model@2", backend="sim", max_batch_size=8, settings=SETTINGS)
    assert ok.state is S.STAGED and ok.ref == "my-model@2"
    for ref, field in (("Bad Name@1", "model"), ("m", "model"), ("m@", "model")):
        with pytest.raises(InvalidInput) as e:
            new_record(ref, backend="sim", max_batch_size=8, settings=SETTINGS)
        assert e.value.field == field
    with pytest.raises(InvalidInput) as e:
        new_record("m@1", backend="sim", max_batch_size=8, artifact="/x", settings=SETTINGS)
    assert e.value.field == "sha256"
    with pytest.raises(InvalidInput) as e:
        new_record("m@1", backend="sim", max_batch_size=8, sha256="abc", settings=SETTINGS)
    assert e.value.field == "sha256"
    with pytest.raises(InvalidInput) as e:
        new_record("m@1", backend="sim", max_batch_size=8, config={"x": 1}, settings=SETTINGS)
    assert e.value.field == "config"


def test_versions_sort_numerically_after_named_ones() -> None:
    assert sorted(["10", "2", "beta", "1"], key=version_order) == ["beta", "1", "2", "10"]


# ---- the lifecycle ------------------------------------------------------------------------
def model(*records: VersionRecord, previous: str | None = None) -> lifecycle.ModelVersions:
    return lifecycle.ModelVersions("m", {r.version: r for r in records}, previous)


def test_canary_takes_a_staged_version_and_needs_a_live_one() -> None:
    m = model(rec("1", S.LIVE), rec("2"))
    c = lifecycle.canary(m, "2", 0.1)
    assert c.states == {"2": (S.CANARY, 0.1)} and c.detail["share_before"] == 0.0
    with pytest.raises(Conflict, match="no live version"):
        lifecycle.canary(model(rec("2")), "2", 0.1)
    with pytest.raises(InvalidInput):
        lifecycle.canary(m, "2", 0.0)
    with pytest.raises(InvalidInput):
        lifecycle.canary(m, "2", 1.5)
    with pytest.raises(NotFound):
        lifecycle.canary(m, "9", 0.1)


def test_one_canary_at_a_time_but_its_share_can_change() -> None:
    m = model(rec("1", S.LIVE), rec("2", S.CANARY, 0.05), rec("3"))
    assert lifecycle.canary(m, "2", 0.2).states == {"2": (S.CANARY, 0.2)}
    with pytest.raises(Conflict, match="already the canary"):
        lifecycle.canary(m, "3", 0.1)


def test_promote_remembers_the_live_version_and_rollback_returns_to_it() -> None:
    m = model(rec("1", S.LIVE), rec("2", S.CANARY, 0.1))
    p = lifecycle.promote(m, "2")
    assert p.states == {"2": (S.LIVE, 0.0), "1": (S.STAGED, 0.0)} and p.previous_live == "1"
    after = model(rec("1"), rec("2", S.LIVE), previous="1")
    r = lifecycle.rollback(after)
    assert r.states == {"2": (S.STAGED, 0.0), "1": (S.LIVE, 0.0)}
    # A second rollback undoes the first.
    assert r.previous_live == "2"


def test_rollback_of_a_canary_withdraws_it_only() -> None:
    m = model(rec("1", S.LIVE), rec("2", S.CANARY, 0.3), previous=None)
    r = lifecycle.rollback(m, "2")
    assert r.states == {"2": (S.STAGED, 0.0)}


def test_rollback_needs_a_target_that_is_not_retired() -> None:
    with pytest.raises(Conflict, match="no earlier live version"):
        lifecycle.rollback(model(rec("1", S.LIVE)))
    with pytest.raises(Conflict, match="retired"):
        lifecycle.rollback(model(rec("1", S.RETIRED), rec("2", S.LIVE), previous="1"))


def test_retire_never_takes_the_live_version_and_clears_the_rollback_target() -> None:
    m = model(rec("1", S.LIVE), rec("2"), previous="2")
    with pytest.raises(Conflict, match="is live"):
        lifecycle.retire(m, "1")
    r = lifecycle.retire(m, "2")
    assert r.states == {"2": (S.RETIRED, 0.0)} and r.previous_live is None
    with pytest.raises(Conflict, match="retired"):
        lifecycle.promote(model(rec("1", S.LIVE), rec("2", S.RETIRED)), "2")


def test_promote_of_the_live_version_is_a_conflict() -> None:
    with pytest.raises(Conflict, match="already live"):
        lifecycle.promote(model(rec("1", S.LIVE)), "1")


def test_records_compare_by_what_changes_the_computation() -> None:
    a = rec("1")
    assert a.same_artifact(replace(a, state=S.LIVE, canary_share=0.0))
    assert not a.same_artifact(replace(a, config={"variant": "x"}))
