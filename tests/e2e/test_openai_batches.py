"""OpenAI's Files and Batches APIs with the official ``openai`` SDK, unmodified, over
real HTTP, Kafka and PostgreSQL: embeddings and completions (gristmill-lm) items."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gristmill.devservices.stack import Services, System, build_system

EMBED = "all-minilm-l6-v2"
LM = "gristmill-lm"
MAX_ITEMS = 400  # this system's item limit, so "too many lines" is cheap to reach


@pytest.fixture(scope="module")
def bsys(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    s = build_system(
        services,
        tmp_path_factory.mktemp("batches"),
        extra_env={
            "GRISTMILL_MAX_JOB_ITEMS": str(MAX_ITEMS),
            "GRISTMILL_MAX_JOB_JSON_ITEMS": "100",
        },
    )
    try:
        s.start_scheduler(workers=1, models=f"{EMBED},{LM}")
        s.url = s.start_api()
        s.wait_until_serving(EMBED, timeout_s=300)
        deadline = time.time() + 180  # the generation model: warm until it answers
        while True:
            r = httpx.post(
                f"{s.url}/v1/completions",
                headers=s.headers(),
                json={"model": LM, "prompt": "warm up", "max_tokens": 2, "temperature": 0},
                timeout=60,
            )
            if r.status_code == 200:
                break
            assert time.time() < deadline, r.text
            time.sleep(1)
        yield s
    finally:
        s.close()


def sdk(s: System, tier: str = "paid") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{s.url}/v1", api_key=s.keys[tier], max_retries=0)


def jsonl(lines: list[dict[str, object]]) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


def embed_line(i: int, text: str) -> dict[str, object]:
    return {
        "custom_id": f"e-{i}",
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": EMBED, "input": text, "encoding_format": "float"},
    }


def gen_line(i: int, prompt: str, max_tokens: int = 8) -> dict[str, object]:
    return {
        "custom_id": f"g-{i}",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": LM, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
    }


def wait_done(c: openai.OpenAI, batch_id: str, timeout_s: float = 240) -> object:
    deadline = time.time() + timeout_s
    while True:
        b = c.batches.retrieve(batch_id)
        if b.status in ("completed", "cancelled", "expired", "failed"):
            return b
        assert b.status in ("validating", "in_progress", "cancelling"), b.status
        assert time.time() < deadline, b
        time.sleep(0.5)


def read_lines(c: openai.OpenAI, file_id: str) -> list[dict[str, object]]:
    return [json.loads(x) for x in c.files.content(file_id).text.splitlines()]


def test_embeddings_batch_end_to_end(bsys: System) -> None:
    c = sdk(bsys)
    texts = [f"sentence number {i} about kafka" for i in range(12)]
    raw = jsonl([embed_line(i, t) for i, t in enumerate(texts)])
    f = c.files.create(file=("in.jsonl", raw), purpose="batch")
    assert f.purpose == "batch" and f.bytes == len(raw) and f.id.startswith("file-")
    assert c.files.retrieve(f.id).filename == "in.jsonl"
    assert c.files.content(f.id).content == raw  # stored as uploaded
    b = c.batches.create(
        input_file_id=f.id,
        endpoint="/v1/embeddings",
        completion_window="24h",
        metadata={"team": "search"},
    )
    assert b.status in ("validating", "in_progress", "completed") and b.metadata == {
        "team": "search"
    }
    assert b.request_counts is not None and b.request_counts.total == len(texts)
    done = wait_done(c, b.id)
    assert done.status == "completed", done  # type: ignore[attr-defined]
    assert done.request_counts.completed == len(texts)  # type: ignore[attr-defined]
    assert done.error_file_id is None and done.completed_at  # type: ignore[attr-defined]
    out = read_lines(c, done.output_file_id)  # type: ignore[attr-defined]
    assert [x["custom_id"] for x in out] == [f"e-{i}" for i in range(len(texts))]  # input order
    direct = c.embeddings.create(model=EMBED, input=texts[3], encoding_format="float")
    line = out[3]
    assert line["error"] is None and line["response"]["status_code"] == 200  # type: ignore[index]
    body = line["response"]["body"]  # type: ignore[index]
    assert body["object"] == "list" and body["data"][0]["object"] == "embedding"
    assert body["data"][0]["embedding"] == pytest.approx(direct.data[0].embedding, abs=1e-5)


def test_completions_batch_gives_each_line_its_own_greedy_continuation(bsys: System) -> None:
    c = sdk(bsys)
    prompts = ["The API", "Kafka keeps", "A tenant that bursts", "The scheduler"]
    f = c.files.create(
        file=("gen.jsonl", jsonl([gen_line(i, p) for i, p in enumerate(prompts)])),
        purpose="batch",
    )
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="2h")
    assert b.completion_window == "2h"
    done = wait_done(c, b.id)
    assert done.status == "completed" and done.request_counts.completed == 4  # type: ignore[attr-defined]
    out = read_lines(c, done.output_file_id)  # type: ignore[attr-defined]
    assert [x["custom_id"] for x in out] == ["g-0", "g-1", "g-2", "g-3"]
    for p, line in zip(prompts, out, strict=True):
        want = c.completions.create(model=LM, prompt=p, max_tokens=8, temperature=0)
        got = line["response"]["body"]  # type: ignore[index]
        assert got["object"] == "text_completion"
        assert got["choices"][0]["text"] == want.choices[0].text


def test_cancel_and_list(bsys: System) -> None:
    c = sdk(bsys)
    lines = [gen_line(i, f"Story {i}: once upon a time", max_tokens=48) for i in range(300)]
    f = c.files.create(file=("long.jsonl", jsonl(lines)), purpose="batch")
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="24h")
    cancelled = c.batches.cancel(b.id)
    assert cancelled.status in ("cancelling", "cancelled"), cancelled
    done = wait_done(c, b.id)
    assert done.status == "cancelled", done  # type: ignore[attr-defined]
    assert done.cancelling_at is not None  # type: ignore[attr-defined]
    rc = done.request_counts  # type: ignore[attr-defined]
    # Items the scheduler had already admitted finish; the rest are cancelled. Either
    # way every line is accounted for, and each cancelled one is in the error file.
    assert rc.total == 300 and rc.completed + rc.failed == 300
    if rc.failed:
        errors = read_lines(c, done.error_file_id)  # type: ignore[attr-defined]
        assert len(errors) == rc.failed
        assert all(e["error"]["code"] == "batch_cancelled" for e in errors)  # type: ignore[index]
    else:
        assert done.error_file_id is None  # type: ignore[attr-defined]
    assert len(read_lines(c, done.output_file_id)) == rc.completed  # type: ignore[attr-defined]
    # Paging with after/limit: the SDK follows has_more/last_id through every page.
    seen = [x.id for x in c.batches.list(limit=1)]
    assert seen == [x.id for x in c.batches.list(limit=100).data]  # every page, once each
    assert seen[0] == b.id  # newest first
    assert f.id in [x.id for x in c.files.list(purpose="batch")]


def status_of(call: object) -> tuple[int, dict[str, object]]:
    try:
        call()  # type: ignore[operator]
    except openai.APIStatusError as exc:
        return exc.status_code, exc.body  # type: ignore[return-value]
    raise AssertionError("accepted")


def test_hostile_input_gets_a_4xx_naming_the_problem(bsys: System) -> None:
    c, other = sdk(bsys), sdk(bsys, "free")

    def batch_of(raw: bytes, endpoint: str = "/v1/embeddings") -> tuple[int, dict[str, object]]:
        f = c.files.create(file=("x.jsonl", raw), purpose="batch")
        return status_of(
            lambda: c.batches.create(
                input_file_id=f.id,
                endpoint=endpoint,  # type: ignore[arg-type]
                completion_window="24h",
            )
        )

    good = json.dumps(embed_line(0, "fine")).encode()
    cases = {
        "line 2": good + b"\n{not json\n",
        "line 2.url": jsonl([embed_line(0, "a"), {**gen_line(1, "b")}]),
        "line 2.custom_id": jsonl([embed_line(0, "a"), embed_line(0, "b")]),
        "line 1.body.input": jsonl(
            [{**embed_line(0, "a"), "body": {"model": EMBED, "input": ["a", "b"]}}]
        ),
        "line 2.body.model": jsonl(
            [embed_line(0, "a"), {**embed_line(1, "b"), "body": {"model": "sim", "input": "b"}}]
        ),
    }
    for param, raw in cases.items():
        code, body = batch_of(raw)
        assert code == 400, (param, body)
        assert body["param"] == param, body  # the SDK hands over the error object
    code, body = batch_of(jsonl([embed_line(i, "x") for i in range(MAX_ITEMS + 1)]))
    assert code == 413 and str(MAX_ITEMS) in str(body["message"]), body
    code, body = batch_of(good + b"\n", endpoint="/v1/moderations")
    assert code == 400 and body["param"] == "endpoint"
    code, body = status_of(lambda: c.files.create(file=("x.jsonl", good), purpose="fine-tune"))
    assert code == 400 and body["param"] == "purpose"
    mine = c.files.create(file=("x.jsonl", good), purpose="batch")
    code, _ = status_of(
        lambda: other.batches.create(
            input_file_id=mine.id, endpoint="/v1/embeddings", completion_window="24h"
        )
    )
    assert code == 404  # another tenant's file is one that does not exist
    assert status_of(lambda: other.files.content(mine.id))[0] == 404
    assert status_of(lambda: other.batches.retrieve("batch_" + "0" * 32))[0] == 404
    code, body = status_of(
        lambda: c.batches.create(
            input_file_id=mine.id,
            endpoint="/v1/embeddings",
            completion_window="forever",  # type: ignore[arg-type]
        )
    )
    assert code == 400 and body["param"] == "completion_window"
    assert c.files.delete(mine.id).deleted
    assert status_of(lambda: c.files.retrieve(mine.id))[0] == 404
    # Not multipart at all: OpenAI's error shape, not a 5xx.
    r = httpx.post(f"{bsys.url}/v1/files", headers=bsys.headers(), json={"purpose": "batch"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "Content-Type"


def test_large_upload_memory_is_bounded(bsys: System) -> None:
    """A file many times larger than any buffer is stored whole, and the API process's
    peak RSS grows by far less than the file (spooled to disk, stored in chunks)."""
    pid = bsys.procs["api"].pid

    def peak_kib() -> int:
        for row in Path(f"/proc/{pid}/status").read_text().splitlines():
            if row.startswith("VmHWM:"):
                return int(row.split()[1])
        raise AssertionError("no VmHWM")

    line = json.dumps(embed_line(0, "x" * 900)).encode() + b"\n"
    size = 200 << 20  # 200 MiB
    raw = line * (size // len(line))
    before = peak_kib()
    c = openai.OpenAI(
        base_url=f"{bsys.url}/v1", api_key=bsys.keys["paid"], max_retries=0, timeout=300
    )
    f = c.files.create(file=("big.jsonl", raw), purpose="batch")
    assert f.bytes == len(raw)
    grew = peak_kib() - before
    print(f"uploaded {len(raw) >> 20} MiB: API peak RSS grew by {grew >> 10} MiB")
    assert grew < 64 << 10, grew
    assert c.files.delete(f.id).deleted


class _Receiver(http.server.BaseHTTPRequestHandler):
    received: list[tuple[bytes, dict[str, str]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Receiver.received.append((body, {k.lower(): v for k, v in self.headers.items()}))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_batch_webhook_is_openais_event_and_the_sdk_unwraps_it(bsys: System) -> None:
    """Decision 53: ``extra_body={"webhook_url": ...}`` asks for the batch's terminal
    event; it arrives in OpenAI's shape, signed by Standard Webhooks, and the unmodified
    SDK's ``webhooks.unwrap()`` verifies and types it."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        c = sdk(bsys)
        url = f"http://127.0.0.1:{server.server_port}/hooks/batches"
        f = c.files.create(file=("in.jsonl", jsonl([embed_line(0, "hooked")])), purpose="batch")
        b = c.batches.create(
            input_file_id=f.id,
            endpoint="/v1/embeddings",
            completion_window="24h",
            extra_body={"webhook_url": url},
        )
        secret = (b.model_extra or {})["webhook_secret"]
        assert secret.startswith("whsec_")
        assert "webhook_secret" not in (c.batches.retrieve(b.id).model_extra or {})  # once
        wait_done(c, b.id)
        deadline = time.time() + 60
        while not _Receiver.received and time.time() < deadline:
            time.sleep(0.2)
        body, headers = _Receiver.received[0]
        event = c.webhooks.unwrap(body, headers, secret=secret)
        assert event.type == "batch.completed" and event.data.id == b.id
        assert type(event).__name__ == "BatchCompletedWebhookEvent"
        with pytest.raises(openai.InvalidWebhookSignatureError):
            c.webhooks.unwrap(body, headers, secret=sdk_secret_of_another_batch(c, f.id))
        assert len(_Receiver.received) == 1  # delivered once
    finally:
        server.shutdown()


def sdk_secret_of_another_batch(c: openai.OpenAI, file_id: str) -> str:
    other = c.batches.create(
        input_file_id=file_id,
        endpoint="/v1/embeddings",
        completion_window="24h",
        extra_body={"webhook_url": "http://127.0.0.1:9/never"},
    )
    c.batches.cancel(other.id)
    return str((other.model_extra or {})["webhook_secret"])


@pytest.mark.parametrize(
    ("webhook_url", "status"),
    [("ftp://x", 400), ("http://169.254.169.254/latest", 400), ("http://a\u0000b/", 400), (5, 422)],
)
def test_a_bad_batch_webhook_is_refused_naming_it(
    bsys: System, webhook_url: object, status: int
) -> None:
    c = sdk(bsys)
    f = c.files.create(file=("in.jsonl", jsonl([embed_line(0, "x")])), purpose="batch")
    code, body = status_of(
        lambda: c.batches.create(
            input_file_id=f.id,
            endpoint="/v1/embeddings",
            completion_window="24h",
            extra_body={"webhook_url": webhook_url},
        )
    )
    assert code == status and body["param"] == "webhook_url", body
