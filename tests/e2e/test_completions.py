"""Generation end to end: OpenAI's own client against /v1/completions over real HTTP,
Kafka and PostgreSQL, a scheduler running continuous batching on a worker process.
Every answer is checked against the plain one-request loop on the same weights."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import pytest
from sqlalchemy import select

torch = pytest.importorskip("torch")
openai = pytest.importorskip("openai")

from gristmill.devservices.stack import Services, System  # noqa: E402
from results.db import make_engine  # noqa: E402
from results.schema import generation_progress, requests  # noqa: E402
from results.tenants import create_tenant, issue_key, set_plan  # noqa: E402
from tests.e2e.generation_system import MODEL, generation_system  # noqa: E402
from workers.models.causal_lm import weights  # noqa: E402
from workers.models.causal_lm.plain import generate  # noqa: E402
from workers.models.causal_lm.tokenizer import Codec  # noqa: E402

PROMPTS = [
    "Every accepted request is",
    "The scheduler",
    "When a worker dies,",
    "Job items",
    "PostgreSQL is also the request log",
    "A tenant that bursts",
    "The API",
    "Kafka keeps",
]


@pytest.fixture(scope="module")
def lm_system(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    with generation_system(services, tmp_path_factory.mktemp("gen")) as sys_:
        yield sys_


@pytest.fixture(scope="module")
def reference() -> Iterator[object]:
    torch.set_num_threads(1)
    model = weights.load("cpu", torch.float32)
    codec = Codec.load()

    @functools.cache  # prompts repeat (the job test's items)
    def greedy(prompt: str, max_tokens: int) -> str:
        ids = generate(model, codec.encode(prompt), max_tokens, eos_id=codec.eos_id)
        return codec.decode(ids)

    yield greedy


def client(system: System, tier: str = "paid") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{system.url}/v1", api_key=system.keys[tier], max_retries=0)


def test_completion_is_the_models_own_greedy_continuation(
    lm_system: System, reference: object
) -> None:
    c = client(lm_system).completions.create(
        model=MODEL, prompt="The scheduler", max_tokens=24, temperature=0
    )
    assert c.object == "text_completion" and c.id.startswith("cmpl-")
    choice = c.choices[0]
    assert choice.text == reference("The scheduler", 24)  # type: ignore[operator]
    assert choice.finish_reason in ("stop", "length")
    assert c.usage is not None and c.usage.prompt_tokens > 0
    assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
    # The request log holds the answer and its token counts.
    rid = c.id.removeprefix("cmpl-")
    with make_engine(lm_system.settings.database_url).connect() as conn:
        row = conn.execute(requests.select().where(requests.c.request_id == rid)).one()
        left = conn.execute(
            generation_progress.select().where(generation_progress.c.request_id == rid)
        ).all()
    assert row.status == "succeeded" and row.model == MODEL
    assert row.output["text"] == choice.text
    assert row.output["completion_tokens"] == c.usage.completion_tokens
    assert row.output["time_to_first_token_ms"] > 0
    if c.usage.completion_tokens > 1:  # the gaps between tokens, in the same row
        itl = row.output["inter_token_ms"]
        assert 0 < itl["p50"] <= itl["p95"] <= itl["max"]
    assert left == []  # progress rows go when the final row is written


def test_streams_of_several_tenants_each_get_their_own_tokens_in_order(
    lm_system: System, reference: object
) -> None:
    def run(i: int) -> tuple[str, list[str], str | None]:
        tier = ("free", "paid", "enterprise")[i % 3]
        stream = client(lm_system, tier).completions.create(
            model=MODEL, prompt=PROMPTS[i], max_tokens=40, temperature=0, stream=True
        )
        pieces, reason = [], None
        for chunk in stream:
            pieces.append(chunk.choices[0].text)
            reason = chunk.choices[0].finish_reason or reason
        return PROMPTS[i], pieces, reason

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(run, range(len(PROMPTS))))
    for prompt, pieces, reason in results:
        assert "".join(pieces) == reference(prompt, 40), prompt  # type: ignore[operator]
        assert len(pieces) > 3  # streamed, not one piece at the end
        assert reason in ("stop", "length")


def test_bad_parameters_are_refused_naming_the_field(lm_system: System) -> None:
    c = client(lm_system)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt="x", max_tokens=0)
    assert "max_tokens" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt="x", max_tokens=4, temperature=3)
    assert "temperature" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt="x " * 400, max_tokens=400)
    assert "context" in str(e.value)


def _events(lines: Iterator[str]) -> Iterator[tuple[int | None, dict[str, object] | None]]:
    """(id, data) of each server-sent event; data None for [DONE]."""
    ident: int | None = None
    for line in lines:
        if line.startswith("id: "):
            ident = int(line[4:])
        elif line.startswith("data: "):
            body = line[6:]
            yield ident, None if body == "[DONE]" else orjson.loads(body)
            ident = None


def test_a_dropped_stream_resumes_where_it_left_off(lm_system: System, reference: object) -> None:
    url, headers = lm_system.url, lm_system.headers()
    body = {"model": MODEL, "prompt": "When a worker dies,", "max_tokens": 60, "temperature": 0}
    seen: list[str] = []
    last = -1
    with httpx.stream(
        "POST", f"{url}/v1/completions", json={**body, "stream": True}, headers=headers
    ) as r:
        assert r.status_code == 200
        rid = r.headers["x-request-id"]
        for ident, data in _events(r.iter_lines()):
            assert data is not None and ident is not None
            seen.append(data["choices"][0]["text"])  # type: ignore[index]
            last = ident
            if len(seen) == 5:
                break  # the connection drops here
    with httpx.stream(
        "GET",
        f"{url}/v1/completions/cmpl-{rid}?stream=true",
        headers={**headers, "Last-Event-ID": str(last)},
    ) as r:
        assert r.status_code == 200, r.read()
        for _, data in _events(r.iter_lines()):
            if data is None:
                break
            seen.append(data["choices"][0]["text"])  # type: ignore[index]
    assert "".join(seen) == reference(body["prompt"], 60)  # type: ignore[operator]
    # Finished: a plain GET gives the stored answer, another tenant gets nothing.
    got = httpx.get(f"{url}/v1/completions/cmpl-{rid}", headers=headers).json()
    assert got["choices"][0]["text"] == "".join(seen)
    other = httpx.get(f"{url}/v1/completions/cmpl-{rid}", headers=lm_system.headers("free"))
    assert other.status_code == 404


LONG = [  # prompts whose greedy answers run to 400 tokens (no end-of-text before)
    "Every accepted request is",
    "The scheduler",
    "Job items",
    "PostgreSQL is also the request log",
    "The API",
    "The worker",
    "Decision",
]


def test_streams_are_capped_per_key_and_a_resume_outlives_the_stream_it_shares(
    lm_system: System, reference: object
) -> None:
    """A free key holds its tier's share of an instance's streams (30 concurrent resumes
    were accepted before); the resumed streams share the first one's wait for the end
    (the shared future of ingest/acceptance/waiters.py) and each still ends when that
    first one is dropped."""
    engine = make_engine(lm_system.settings.database_url)
    with engine.begin() as conn:
        tenant = create_tenant(conn, f"free-{uuid.uuid4().hex[:8]}", "free")
        set_plan(conn, tenant.name, rate_rps=1e6, burst=1e6)
        headers = {"Authorization": f"Bearer {issue_key(conn, tenant)[1]}"}
    engine.dispose()
    url, prompt = lm_system.url, LONG[0]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 400, "temperature": 0, "stream": True}
    per_key = lm_system.settings.tier_max_streams["free"]
    with httpx.Client(timeout=60) as client:
        first = client.send(
            client.build_request("POST", f"{url}/v1/completions", json=body, headers=headers),
            stream=True,
        )
        assert first.status_code == 200, first.read()
        rid = first.headers["x-request-id"]
        # Kept: an iterator over a response that is dropped half read closes its
        # connection (httpcore closes on GeneratorExit), which would end this stream and
        # free its slot before the others are counted.
        first_events = _events(first.iter_lines())
        next(first_events)  # generating: its tokens are in the database
        # Frozen mid-generation, so every stream stays open however fast the model is.
        group = lm_system.procs["scheduler"].pid
        os.killpg(group, signal.SIGSTOP)
        try:
            resume = client.build_request(
                "GET", f"{url}/v1/completions/cmpl-{rid}?stream=true", headers=headers
            )
            resumed = [client.send(resume, stream=True) for _ in range(per_key - 1)]
            assert [r.status_code for r in resumed] == [200] * (per_key - 1)
            # Streamed, so a stream wrongly accepted fails here instead of reading forever.
            over = client.send(resume, stream=True)
            if over.status_code == 200:
                over.close()
                pytest.fail(f"stream {per_key + 1} of a key that may hold {per_key} was accepted")
            over.read()
            assert over.status_code == 429 and int(over.headers["Retry-After"]) >= 1, over.text
            assert over.json()["error"]["type"] == "rate_limit_error"
            first_events.close()
            first.close()  # the first caller goes; the others wait on the future it shared
            time.sleep(0.5)
        finally:
            os.killpg(group, signal.SIGCONT)
        deadline = time.monotonic() + 120
        for r in resumed:
            text, ended = [], False
            for line in r.iter_lines():  # keep-alives (every 15 s) let the clock be read
                assert time.monotonic() < deadline, "a resumed stream never ended"
                if line == "data: [DONE]":
                    ended = True
                    break
                if line.startswith("data: "):
                    text.append(orjson.loads(line[6:])["choices"][0]["text"])
            r.close()
            assert ended and "".join(text) == reference(prompt, 400)  # type: ignore[operator]
        again = client.get(f"{url}/v1/completions/cmpl-{rid}?stream=true", headers=headers)
        assert again.status_code == 200  # the slots were given back


def test_a_scheduler_killed_mid_generation_loses_no_stream(
    lm_system: System, reference: object
) -> None:
    """Streams stay open on the API while their scheduler is killed; the next scheduler
    resumes each request from its progress rows, and every caller gets its whole text,
    each token once, and the request log one row per request."""
    n_streams, n = 14, 400
    started = threading.Event()
    rids: dict[int, str] = {}

    def run(i: int) -> str:
        stream = client(lm_system, ("free", "paid", "enterprise")[i % 3]).completions.create(
            model=MODEL, prompt=LONG[i % len(LONG)], max_tokens=n, temperature=0, stream=True
        )
        pieces = []
        for chunk in stream:
            rids[i] = chunk.id.removeprefix("cmpl-")
            pieces.append(chunk.choices[0].text)
            if len(rids) == n_streams:
                started.set()
        return "".join(pieces)

    db = make_engine(lm_system.settings.database_url)
    with ThreadPoolExecutor(n_streams) as pool:
        futures = [pool.submit(run, i) for i in range(n_streams)]
        assert started.wait(120), "every stream got a token"
        proc = lm_system.procs.pop("scheduler")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        with db.connect() as conn:
            ended = conn.execute(
                select(requests.c.request_id).where(requests.c.request_id.in_(list(rids.values())))
            ).all()
        assert len(ended) < n_streams, "the scheduler died with requests still generating"
        lm_system.start_scheduler(workers=1, models=MODEL)
        texts = [f.result(timeout=300) for f in futures]
    for i, text_ in enumerate(texts):
        assert text_ == reference(LONG[i % len(LONG)], n), i  # type: ignore[operator]
    with db.connect() as conn:
        rows = conn.execute(
            select(requests.c.request_id, requests.c.status).where(
                requests.c.request_id.in_(list(rids.values()))
            )
        ).all()
    assert len(rows) == n_streams and {r.status for r in rows} == {"succeeded"}


def test_a_job_of_generation_items_gives_each_its_own_continuation(
    lm_system: System, reference: object
) -> None:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(24)]
    r = httpx.post(
        f"{lm_system.url}/v1/jobs",
        json={
            "model": MODEL,
            "items": [{"custom_id": f"g{i}", "input": p} for i, p in enumerate(prompts)],
            "params": {"max_tokens": 30, "temperature": 0},
        },
        headers=lm_system.headers(),
        timeout=60,
    )
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    deadline = time.time() + 180
    while True:
        j = httpx.get(f"{lm_system.url}/v1/jobs/{job_id}", headers=lm_system.headers()).json()
        if j["status"] in ("completed", "failed", "cancelled", "expired") and j["finished_at"]:
            break
        assert time.time() < deadline, j
        time.sleep(0.5)
    assert j["status"] == "completed" and j["counts"]["succeeded"] == len(prompts), j
    got = httpx.get(
        f"{lm_system.url}/v1/jobs/{job_id}/results", headers=lm_system.headers(), timeout=60
    )
    results = [orjson.loads(line) for line in got.content.splitlines() if line]
    assert [x["custom_id"] for x in results] == [f"g{i}" for i in range(len(prompts))]
    for x in results:
        assert x["output"]["text"] == reference(prompts[x["index"]], 30)  # type: ignore[operator]


def test_a_retry_with_the_same_idempotency_key_is_the_same_completion(
    lm_system: System,
) -> None:
    """Same key and body: the same id and text, sampled or not, plain or streamed (a
    streamed retry resumes after its Last-Event-ID); another body: 422 naming the key."""
    url = lm_system.url
    body = {"model": MODEL, "prompt": "The scheduler", "max_tokens": 30, "temperature": 0.9}
    keyed = {**lm_system.headers(), "Idempotency-Key": f"gen-{time.time_ns()}"}
    first = httpx.post(f"{url}/v1/completions", json=body, headers=keyed, timeout=120)
    assert first.status_code == 200, first.text
    again = httpx.post(f"{url}/v1/completions", json=body, headers=keyed, timeout=120)
    assert again.status_code == 200, again.text
    a, b = first.json(), again.json()
    assert a["id"] == b["id"] and a["choices"][0]["text"] == b["choices"][0]["text"]
    # Without the key the same sampled body draws a new seed: a new request.
    other = httpx.post(f"{url}/v1/completions", json=body, headers=lm_system.headers(), timeout=120)
    assert other.json()["id"] != a["id"]
    rid = a["id"].removeprefix("cmpl-")
    with make_engine(lm_system.settings.database_url).connect() as conn:
        rows = conn.execute(select(requests.c.request_id).where(requests.c.request_id == rid)).all()
    assert len(rows) == 1  # one request, one row
    # A streamed retry of the same body: the same request, resumed after event 4.
    with httpx.stream(
        "POST",
        f"{url}/v1/completions",
        json={**body, "stream": True},
        headers={**keyed, "Last-Event-ID": "4"},
        timeout=120,
    ) as r:
        assert r.status_code == 200 and r.headers["x-request-id"] == rid
        events = list(_events(r.iter_lines()))
    ids = [i for i, d in events if i is not None]
    assert ids[0] == 5 and ids == sorted(ids)
    streamed = "".join(d["choices"][0]["text"] for _, d in events if d)  # type: ignore[index]
    assert a["choices"][0]["text"].endswith(streamed) and streamed
    # The same key with another body is refused, in OpenAI's shape.
    clash = httpx.post(
        f"{url}/v1/completions", json={**body, "max_tokens": 31}, headers=keyed, timeout=60
    )
    assert clash.status_code == 422
    assert clash.json()["error"]["param"] == "Idempotency-Key"
    assert clash.json()["error"]["code"] == "idempotency_key_reused"


def test_a_stream_retried_mid_generation_gets_the_same_tokens(
    lm_system: System, reference: object
) -> None:
    """A stream dropped after a few tokens and retried with its key (no request id at
    hand) goes on with the same request: each token once, the whole greedy text."""
    url, prompt = lm_system.url, "PostgreSQL is also the request log"
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 200, "temperature": 0, "stream": True}
    keyed = {**lm_system.headers(), "Idempotency-Key": f"gen-{time.time_ns()}"}
    seen: list[str] = []
    last = -1
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=keyed) as r:
        rid = r.headers["x-request-id"]
        for ident, data in _events(r.iter_lines()):
            assert ident is not None and data is not None
            seen.append(data["choices"][0]["text"])  # type: ignore[index]
            last = ident
            if len(seen) == 3:
                break
    with httpx.stream(
        "POST",
        f"{url}/v1/completions",
        json=body,
        headers={**keyed, "Last-Event-ID": str(last)},
        timeout=120,
    ) as r:
        assert r.headers["x-request-id"] == rid
        for _, data in _events(r.iter_lines()):
            if data is None:
                break
            seen.append(data["choices"][0]["text"])  # type: ignore[index]
    assert "".join(seen) == reference(prompt, 200)  # type: ignore[operator]


def test_the_sdks_exceptions_carry_openais_error_fields(lm_system: System) -> None:
    c = client(lm_system)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL, prompt="x", max_tokens=4, temperature=3)
    assert e.value.param == "temperature" and e.value.code == "invalid_input"
    assert "temperature" in e.value.message
    with pytest.raises(openai.UnprocessableEntityError) as u:
        c.completions.create(model=MODEL, prompt="x", max_tokens=4, extra_body={"best_of": 2})
    assert u.value.param == "best_of"
    with pytest.raises(openai.NotFoundError) as nf:
        c.completions.create(model="no-such-model", prompt="x")
    assert nf.value.code is not None and "no-such-model" in nf.value.message
    # GET /v1/completions/{id}: OpenAI's shape too.
    r = httpx.get(f"{lm_system.url}/v1/completions/cmpl-not-an-id", headers=lm_system.headers())
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    bad_key = openai.OpenAI(base_url=f"{lm_system.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as au:
        bad_key.completions.create(model=MODEL, prompt="x")
    assert au.value.code == "unauthorized"


def test_streams_of_several_tenants_while_a_job_of_generation_items_runs(
    lm_system: System, reference: object
) -> None:
    """The job's items share the step loop with live streams: every stream gets its own
    tokens in order, and every item its own continuation."""
    # Enough work (400 x 100 tokens) that the job is still running when the streams
    # open on any machine; 40 short items could all finish first on a quick one.
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(400)]
    r = httpx.post(
        f"{lm_system.url}/v1/jobs",
        json={
            "model": MODEL,
            "items": [{"custom_id": f"j{i}", "input": p} for i, p in enumerate(prompts)],
            "params": {"max_tokens": 100, "temperature": 0},
        },
        headers=lm_system.headers("enterprise"),
        timeout=60,
    )
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]

    def stream(i: int) -> tuple[str, list[str]]:
        tier = ("free", "paid", "enterprise")[i % 3]
        chunks = client(lm_system, tier).completions.create(
            model=MODEL, prompt=PROMPTS[i], max_tokens=40, temperature=0, stream=True
        )
        return PROMPTS[i], [c.choices[0].text for c in chunks]

    job_headers = lm_system.headers("enterprise")
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(stream, i) for i in range(6)]
        # The streams are open while the job's items are still being generated.
        before = httpx.get(f"{lm_system.url}/v1/jobs/{job_id}", headers=job_headers).json()
        streamed = [f.result(timeout=300) for f in futures]
    assert before["finished_at"] is None, before
    for prompt, pieces in streamed:
        assert "".join(pieces) == reference(prompt, 40), prompt  # type: ignore[operator]
        assert len(pieces) > 3
    deadline = time.time() + 300
    while True:
        j = httpx.get(f"{lm_system.url}/v1/jobs/{job_id}", headers=job_headers).json()
        if j["status"] in ("completed", "failed", "cancelled", "expired") and j["finished_at"]:
            break
        assert time.time() < deadline, j
        time.sleep(0.5)
    assert j["status"] == "completed" and j["counts"]["succeeded"] == len(prompts), j
    got = httpx.get(f"{lm_system.url}/v1/jobs/{job_id}/results", headers=job_headers, timeout=60)
    results = [orjson.loads(line) for line in got.content.splitlines() if line]
    assert len(results) == len(prompts)
    for x in results:
        assert x["output"]["text"] == reference(prompts[x["index"]], 100)  # type: ignore[operator]
