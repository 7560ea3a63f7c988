"""Generation models over time end to end (decision 67): a second ``gristmill-lm`` version
(the packaged weights perturbed by a seed) registered with the CLI, loaded by the
scheduler's generation worker beside version 1, and answering with text of its own;
a canary by share, sticky per tenant, as observed over twenty tenants; promote and
rollback reaching two API instances within 2 s; replay at temperature 0 reporting
exact match and token similarity.

``gristmill-lm`` is the one generation model, and the session's registry is shared: the
versions registered here have names of their own, and the module leaves version 1 live
and its versions retired.
"""

from __future__ import annotations

import functools
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from sqlalchemy import select

from core.models.registry import DEFAULT_WEIGHTS_NOISE
from gristmill.devservices.stack import Services, System, build_system
from ingest.acceptance.routing import bucket
from ingest.openai.completion_wire import ID_PREFIX
from results.db import make_engine
from results.schema import requests
from results.tenants import create_tenant, issue_key
from tests.e2e.model_cli import models_cli, switch_time
from workers.models.causal_lm import weights
from workers.models.causal_lm.plain import generate
from workers.models.causal_lm.tokenizer import Codec

pytestmark = pytest.mark.slow
NAME = "gristmill-lm"
RUN = uuid.uuid4().hex[:6]
SEEDED = f"s{RUN}"  # the packaged weights perturbed by seed 2
SAME = f"c{RUN}"  # the packaged weights again: agrees with version 1
SEED = 2
PROMPTS = ["The river", "Once upon a time", "The miller said", "In the morning"]


class LMV:
    def __init__(self, system: System, urls: list[str]):
        self.system = system
        self.urls = urls
        self.db = make_engine(system.settings.database_url)

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return models_cli(self.system.env, *args, check=check)

    def complete(
        self,
        model: str,
        prompt: str,
        *,
        key: str | None = None,
        url: str | None = None,
        temperature: float = 0.0,
        max_tokens: int = 16,
    ) -> httpx.Response:
        return httpx.post(
            f"{url or self.urls[0]}/v1/completions",
            json={
                "model": model,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": temperature,
            },
            headers={"Authorization": f"Bearer {key or self.system.keys['paid']}"},
            timeout=120,
        )

    def answered(self, r: httpx.Response) -> tuple[str, str]:
        """(version, text) of a completion: the version from its request-log row."""
        assert r.status_code == 200, r.text
        body = r.json()
        rid = body["id"].removeprefix(ID_PREFIX)
        with self.db.connect() as conn:
            version = conn.execute(
                select(requests.c.model_version).where(requests.c.request_id == rid)
            ).scalar_one()
        return version, body["choices"][0]["text"]

    def until_ok(self, model: str, timeout_s: float = 120) -> httpx.Response:
        deadline = time.time() + timeout_s
        while True:
            r = self.complete(model, "warm up", max_tokens=2)
            if r.status_code == 200 or time.time() > deadline:
                return r
            time.sleep(0.5)


@pytest.fixture(scope="module")
def lmv(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LMV]:
    system = build_system(services, tmp_path_factory.mktemp("lmversions"))
    t = LMV(system, [])
    try:
        t.cli(
            "register",
            f"{NAME}@{SEEDED}",
            "--backend",
            "causal-lm",
            "--config",
            f'{{"weights_seed": {SEED}}}',
        )
        system.start_scheduler(workers=1, models=NAME)
        t.urls = [system.start_api("api-a"), system.start_api("api-b")]
        system.url = t.urls[0]
        r = t.until_ok(f"{NAME}@{SEEDED}")  # loaded by the worker beside version 1
        assert r.status_code == 200, r.text
        yield t
    finally:
        # Leave the shared registry as it was: version 1 live, these versions retired.
        t.cli("promote", f"{NAME}@1", check=False)
        t.cli("rollback", NAME, f"{NAME}@{SEEDED}", check=False)  # a canary left behind
        for v in (SEEDED, SAME):
            t.cli("retire", f"{NAME}@{v}", check=False)
        system.close()


@pytest.fixture(scope="module")
def reference() -> object:
    """Greedy text computed here, in this process, from version 1's and the seeded
    version's weights."""
    torch.set_num_threads(1)
    models = {
        "1": weights.load("cpu", torch.float32),
        SEEDED: weights.load_version("", SEED, DEFAULT_WEIGHTS_NOISE),
    }
    codec = Codec.load()

    @functools.cache
    def greedy(version: str, prompt: str, max_tokens: int = 16) -> str:
        ids = generate(models[version], codec.encode(prompt), max_tokens, eos_id=codec.eos_id)
        return codec.decode(ids)

    return greedy


def test_two_versions_each_answer_with_their_own_text(lmv: LMV, reference: object) -> None:
    differ = 0
    for p in PROMPTS:
        v1 = lmv.answered(lmv.complete(f"{NAME}@1", p))
        v2 = lmv.answered(lmv.complete(f"{NAME}@{SEEDED}", p))
        assert v1 == ("1", reference("1", p))  # type: ignore[operator]
        assert v2 == (SEEDED, reference(SEEDED, p))  # type: ignore[operator]
        differ += v1[1] != v2[1]
    print(f"{differ} of {len(PROMPTS)} prompts get other text from {SEEDED}")
    assert differ >= len(PROMPTS) // 2
    # Unpinned requests go to the live version.
    assert lmv.answered(lmv.complete(NAME, PROMPTS[0]))[0] == "1"


def test_a_canary_share_is_observed_and_sticky_per_tenant(lmv: LMV) -> None:
    lmv.cli("canary", f"{NAME}@{SEEDED}", "--share", "0.5")
    time.sleep(1.5)  # every API instance has re-read the routes
    keys: dict[str, str] = {}
    with lmv.db.begin() as conn:
        for i in range(20):
            tenant = create_tenant(conn, f"lmv-{RUN}-{i}", "paid")
            keys[tenant.id] = issue_key(conn, tenant)[1]
    on_canary = 0
    for tenant_id, key in keys.items():
        expect = SEEDED if bucket(NAME, SEEDED, f"tenant\x00{tenant_id}") < 0.5 else "1"
        got = {
            lmv.answered(lmv.complete(NAME, f"tenant {i}", key=key, url=lmv.urls[i % 2]))[0]
            for i in range(3)
        }
        assert got == {expect}, (tenant_id, got)
        on_canary += expect == SEEDED
    print(f"canary share observed: {on_canary}/{len(keys)} tenants at a 0.5 share")
    assert 0 < on_canary < len(keys)


def _switch_time(lmv: LMV, version: str, since: float) -> float:
    """Seconds from ``since`` until both API instances answer unpinned with ``version``
    (``answered`` asserts that nothing errs meanwhile)."""

    def answered_by(url: str) -> str:
        return lmv.answered(lmv.complete(NAME, "switch", url=url, max_tokens=1))[0]

    return switch_time(answered_by, lmv.urls, version, since)


def test_promote_and_rollback_reach_every_api_instance_within_2s(lmv: LMV) -> None:
    lmv.cli("promote", f"{NAME}@{SEEDED}")
    t = time.time()
    promoted = _switch_time(lmv, SEEDED, t)
    r = lmv.cli("rollback", NAME)
    assert "rollback" in r.stdout
    t = time.time()
    rolled_back = _switch_time(lmv, "1", t)
    print(f"promote reached both APIs in {promoted:.3f} s, rollback in {rolled_back:.3f} s")
    assert promoted <= 2.0 and rolled_back <= 2.0


def test_replay_reports_exact_match_and_token_similarity(lmv: LMV, tmp_path: Path) -> None:
    paid = lmv.system.keys["paid"]
    for i, p in enumerate(PROMPTS * 3):  # recorded traffic on version 1, some of it sampled
        temperature = 0.8 if i % 3 == 0 else 0.0
        answer = lmv.complete(f"{NAME}@1", f"{p} {i}", key=paid, temperature=temperature)
        assert lmv.answered(answer)[0] == "1"
    out = tmp_path / "replay.json"
    r = lmv.cli(
        "replay",
        "--candidate",
        f"{NAME}@{SEEDED}",
        "--since",
        "1h",
        "--baseline",
        "1",
        "--limit",
        "12",
        "--out",
        str(out),
        check=False,
    )
    print(r.stdout)
    assert r.returncode == 2, r.stdout + r.stderr  # other weights: other text
    assert "text comparison" in r.stdout and "tok sim" in r.stdout and "FAILED" in r.stdout
    report = json.loads(out.read_text())
    overall = report["overall"]
    assert overall["compared"] == 12 and overall["agreement"] < 0.99
    assert 0 <= overall["mean_token_similarity"] < 1.0
    # The packaged weights under another version name agree with version 1 on every
    # prompt, the sampled ones too: both sides ran greedy.
    lmv.cli("register", f"{NAME}@{SAME}", "--backend", "causal-lm")
    assert lmv.until_ok(f"{NAME}@{SAME}").status_code == 200
    r = lmv.cli(
        "replay", "--candidate", f"{NAME}@{SAME}", "--since", "1h", "--baseline", "1",
        "--limit", "12", "--out", str(out),
    )  # fmt: skip
    print(r.stdout)
    assert "PASSED" in r.stdout
    report = json.loads(out.read_text())
    assert report["overall"]["agreement"] == 1.0
    assert report["overall"]["mean_token_similarity"] == 1.0


def test_a_causal_lm_version_of_another_name_is_refused(lmv: LMV) -> None:
    r = lmv.cli("register", f"other-lm-{RUN}@1", "--backend", "causal-lm", check=False)
    assert r.returncode != 0 and "gristmill-lm" in r.stdout + r.stderr
