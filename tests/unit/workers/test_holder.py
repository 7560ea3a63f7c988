"""The versions a worker holds (workers/holder.py) and the sha256 check before loading
(workers/models/loader.py), with the real sim runtime: no torch, no sockets."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from core.config import Settings
from core.models.artifact import ArtifactError
from core.models.registry import VersionRecord
from core.protocol import LoadModel, ModelState, ModelStatus, UnloadModel
from core.vocab import ModelRef
from workers.holder import Holder
from workers.models.loader import load_record

SETTINGS = Settings(sim_batch_ms=1)


class Conn:
    """Stands for a scheduler's connection: the holder only hashes it and sends to it."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


def sim(version: str, **kw: Any) -> VersionRecord:
    return VersionRecord("m", version, "sim", 8, {"batch_ms": 1}, **kw)


def holder() -> tuple[Holder, list[tuple[Conn, ModelStatus]]]:
    sent: list[tuple[Conn, ModelStatus]] = []
    return Holder(SETTINGS, lambda c, s: sent.append((c, s))), sent  # type: ignore[arg-type, misc]


def run(h: Holder, *cmds: tuple[Conn, LoadModel | UnloadModel]) -> None:
    for c, m in cmds:
        h.command(c, m)  # type: ignore[arg-type]
    h.stop()
    h.run()


def states(sent: Sequence[tuple[Conn, ModelStatus]], conn: Conn) -> list[str]:
    return [f"{s.name}@{s.version}:{s.state}" for c, s in sent if c is conn]


def test_a_load_is_announced_to_every_scheduler_and_the_model_serves() -> None:
    h, sent = holder()
    a, b = Conn("a"), Conn("b")
    h.attach([a, b])  # type: ignore[list-item]
    run(h, (a, LoadModel(sim("1"))))
    assert states(sent, a) == states(sent, b) == ["m@1:loading", "m@1:ready"]
    ready = sent[-1][1]
    assert ready.info is not None and ready.info.record == sim("1")
    model = h.begin(ModelRef("m", "1"))
    assert model is not None and len(model.predict(["x", "y"], {"salt": ""})) == 2
    h.end(ModelRef("m", "1"))


def test_a_second_ask_for_a_loaded_version_is_answered_at_once() -> None:
    h, sent = holder()
    a, b = Conn("a"), Conn("b")
    h.attach([a, b])  # type: ignore[list-item]
    run(h, (a, LoadModel(sim("1"))))
    sent.clear()
    h2 = h
    run(h2, (b, LoadModel(sim("1"))))
    assert states(sent, b) == ["m@1:ready"] and states(sent, a) == []


def test_a_version_stays_while_any_scheduler_wants_it() -> None:
    h, sent = holder()
    a, b = Conn("a"), Conn("b")
    h.attach([a, b])  # type: ignore[list-item]
    run(h, (a, LoadModel(sim("1"))), (b, LoadModel(sim("1"))), (a, UnloadModel("m", "1")))
    assert ModelRef("m", "1") in h.models
    run(h, (b, UnloadModel("m", "1")))
    assert ModelRef("m", "1") not in h.models
    assert states(sent, a)[-1] == "m@1:unloaded"


def test_a_load_queued_by_a_scheduler_that_then_went_away_is_not_carried_out() -> None:
    h, sent = holder()
    a, b = Conn("a"), Conn("b")
    h.attach([a, b])  # type: ignore[list-item]
    h.command(a, LoadModel(sim("1")))  # type: ignore[arg-type]
    h.forget(a)  # type: ignore[arg-type]
    run(h)
    assert ModelRef("m", "1") not in h.models and sent == []
    run(h, (b, LoadModel(sim("1"))), (b, UnloadModel("m", "1")))
    assert ModelRef("m", "1") not in h.models, "a has no hold left to keep it"


def test_an_unload_waits_for_the_versions_last_batch() -> None:
    h, _sent = holder()
    a = Conn("a")
    h.attach([a])  # type: ignore[list-item]
    run(h, (a, LoadModel(sim("1"))))
    ref = ModelRef("m", "1")
    assert h.begin(ref) is not None  # a batch in flight
    t = threading.Thread(target=run, args=(h, (a, UnloadModel("m", "1"))))
    t.start()
    t.join(0.3)
    assert t.is_alive() and ref in h.models  # still waiting for the batch
    h.end(ref)
    t.join(5)
    assert not t.is_alive() and ref not in h.models


def test_a_digest_mismatch_fails_the_load_and_the_version_never_serves(tmp_path: Path) -> None:
    f = tmp_path / "weights"
    f.write_bytes(b"the real weights")
    h, sent = holder()
    a = Conn("a")
    h.attach([a])  # type: ignore[list-item]
    run(h, (a, LoadModel(sim("2", artifact=str(f), sha256="0" * 64))))
    assert states(sent, a) == ["m@2:loading", "m@2:failed"]
    assert "sha256 mismatch" in (sent[-1][1].error or "")
    assert h.begin(ModelRef("m", "2")) is None


def test_an_upstreams_status_reaches_the_scheduler_without_its_password() -> None:
    h, sent = holder()
    a = Conn("a")
    h.attach([a])  # type: ignore[list-item]
    run(h, (a, LoadModel(sim("3"))))
    listener = h.models[ModelRef("m", "3")].status_listener
    assert listener is not None
    # What the HTTP backend reports when its circuit opens (workers/models/http_backend.py).
    listener(ModelState.UNAVAILABLE, "http://svc:hunter2@up.internal/predict is down", 2.0)
    error = sent[-1][1].error or ""
    assert "up.internal" in error and "hunter2" not in error


def test_load_record_checks_the_digest_before_loading(tmp_path: Path) -> None:
    f = tmp_path / "weights"
    f.write_bytes(b"abc")
    good = hashlib.sha256(b"abc").hexdigest()
    loaded = load_record(sim("3", artifact=str(f), sha256=good), SETTINGS)
    assert loaded.info.sha256 == good and loaded.info.profile_ms
    with pytest.raises(ArtifactError, match="refusing to load"):
        load_record(sim("3", artifact=str(f), sha256="f" * 64), SETTINGS)


def test_another_build_of_a_held_version_replaces_it() -> None:
    h, sent = holder()
    a = Conn("a")
    h.attach([a])  # type: ignore[list-item]
    run(h, (a, LoadModel(sim("1"))))
    other = VersionRecord("m", "1", "sim", 8, {"batch_ms": 1, "variant": "b"})
    run(h, (a, LoadModel(other)))
    assert states(sent, a)[-3:] == ["m@1:unloaded", "m@1:loading", "m@1:ready"]
    assert h.infos[ModelRef("m", "1")].record == other


def test_sim_memory_is_really_held() -> None:
    loaded = load_record(
        VersionRecord("m", "9", "sim", 8, {"batch_ms": 1, "memory_mb": 5}), SETTINGS
    )
    assert loaded.info.memory_bytes == 5_000_000
    loaded.model.close()
    assert loaded.model.memory_bytes() == 0
