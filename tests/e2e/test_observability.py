"""Seeing inside a running system: a real Prometheus scrapes the API (two uvicorn
processes, multiprocess metrics) and a scheduler, PromQL gives back exactly the
traffic sent, the alert rules load and evaluate; a request sent with a traceparent
yields one trace through the API, the scheduler and a worker, received by an OTLP/HTTP
endpoint in this test."""

from __future__ import annotations

import gzip
import math
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from gristmill.devservices import free_port
from gristmill.devservices.stack import Services, System, build_system
from results.db import make_engine
from results.tenants import create_tenant, issue_key, set_plan
from tests.e2e.prom import MISSING, Prometheus, settled
from tests.e2e.waits import eventually


# ---- an OTLP/HTTP traces endpoint ------------------------------------------------------
class SpanSink:
    """Decodes OTLP/HTTP protobuf export requests (opentelemetry-proto) into dicts."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                    ExportTraceServiceRequest,
                    ExportTraceServiceResponse,
                )

                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                sink.add(req)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, req: Any) -> None:
        for rs in req.resource_spans:
            service = next(
                (a.value.string_value for a in rs.resource.attributes if a.key == "service.name"),
                "",
            )
            for ss in rs.scope_spans:
                for s in ss.spans:
                    with self.lock:
                        self.spans.append(
                            {
                                "service": service,
                                "name": s.name,
                                "trace_id": s.trace_id.hex(),
                                "span_id": s.span_id.hex(),
                                "parent": s.parent_span_id.hex(),
                                "links": [(lk.trace_id.hex(), lk.span_id.hex()) for lk in s.links],
                                "attrs": {a.key: _value(a.value) for a in s.attributes},
                            }
                        )

    def of_trace(self, trace_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["trace_id"] == trace_id]


def _value(v: Any) -> Any:
    """An OTLP AnyValue as Python (the kinds span attributes use here)."""
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


# ---- the system ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sink() -> Iterator[SpanSink]:
    s = SpanSink()
    yield s
    s.server.shutdown()


@pytest.fixture(scope="module")
def observed(
    services: Services, sink: SpanSink, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[System, int]]:
    workdir = tmp_path_factory.mktemp("observed")
    system = build_system(services, workdir, extra_env={"GRISTMILL_OTLP_TRACES_ENDPOINT": sink.url})
    metrics_port = free_port()
    try:
        system.start_scheduler(env={"GRISTMILL_METRICS_PORT": str(metrics_port)})
        system.url = system.start_api(processes=2)
        system.wait_until_serving("sim")
        yield system, metrics_port
    finally:
        system.close()


@pytest.fixture(scope="module")
def prom(
    observed: tuple[System, int], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    if shutil.which("prometheus") is None:
        pytest.skip(MISSING)
    system, metrics_port = observed
    p = Prometheus(
        tmp_path_factory.mktemp("prometheus"),
        {
            "gristmill-api": system.url.removeprefix("http://"),
            "gristmill-scheduler": f"127.0.0.1:{metrics_port}",
        },
    )
    try:
        ups = eventually(
            lambda: p.query("up"), lambda r: len(r) == 2 and all(x["value"][1] == "1" for x in r)
        )
        assert {x["metric"]["job"] for x in ups} == {"gristmill-api", "gristmill-scheduler"}, ups
        yield p
    finally:
        p.stop()


def infer(system: System, key: str, text: str, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{system.url}/v1/infer",
        json={"model": "sim", "input": text},
        headers={"Authorization": f"Bearer {key}", **headers},
        timeout=30,
    )


def new_key(system: System, tier: str, **plan: float) -> str:
    with make_engine(system.settings.database_url).begin() as conn:
        name = f"{tier}-{uuid.uuid4().hex[:8]}"
        t = create_tenant(conn, name, tier)
        if plan:
            set_plan(conn, name, **plan)  # type: ignore[arg-type]
        return issue_key(conn, t)[1]


# ---- the tests -------------------------------------------------------------------------
N = 40

COUNTS = {
    "admitted": 'sum(gristmill_admission_total{tier="paid",outcome="admitted"})',
    "answered": 'sum(gristmill_api_responses_total{tier="paid",code="200"})',
    "total": 'sum(gristmill_request_duration_seconds_count{class="paid",model="sim"})',
    "respond": 'sum(gristmill_stage_duration_seconds_count{stage="respond",class="paid"})',
    "queue": 'sum(gristmill_stage_duration_seconds_count{stage="queue",class="paid"})',
    "compute": 'sum(gristmill_stage_duration_seconds_count{stage="compute",class="paid"})',
    "persist": 'sum(gristmill_stage_duration_seconds_count{stage="persist",class="paid"})',
    "finished": 'sum(gristmill_requests_finished_total{class="paid",status="succeeded"})',
}


def test_promql_counts_exactly_the_requests_sent(
    observed: tuple[System, int], prom: Prometheus
) -> None:
    system, _ = observed
    before = {k: settled(prom, q) for k, q in COUNTS.items()}
    batches_before = settled(prom, 'sum(gristmill_batches_total{model="sim"})')
    with ThreadPoolExecutor(16) as pool:
        codes = list(
            pool.map(lambda i: infer(system, system.keys["paid"], f"n{i}").status_code, range(N))
        )
    assert codes == [200] * N
    for k, q in COUNTS.items():
        got = eventually(lambda q=q: prom.value(q), lambda v, k=k: v == before[k] + N)
        assert got == before[k] + N, (k, before[k], got)
    time.sleep(3)  # a few more scrapes: nothing counted twice
    for k, q in COUNTS.items():
        assert prom.value(q) == before[k] + N, k
    batches = prom.value('sum(gristmill_batches_total{model="sim"})') or 0
    assert 1 <= batches - batches_before <= N
    # sim computes a batch in 100 ms: the median compute lands in the (0.1, 0.2] bucket.
    median = prom.value(
        "histogram_quantile(0.5, sum by (le) "
        '(rate(gristmill_stage_duration_seconds_bucket{stage="compute",model="sim"}[1m])))'
    )
    assert median is not None and 0.1 <= median <= 0.2, median
    busy = prom.value("sum(rate(gristmill_worker_busy_seconds_total[1m]))")
    assert busy is not None and busy > 0


def test_refusals_are_counted_by_tier_and_reason(
    observed: tuple[System, int], prom: Prometheus
) -> None:
    system, _ = observed
    q = 'sum(gristmill_admission_total{tier="free",outcome="429",reason="tenant_rate"})'
    before = settled(prom, q)
    key = new_key(system, "free", rate_rps=0.5, burst=1)
    codes = [infer(system, key, f"r{i}").status_code for i in range(6)]
    refused = codes.count(429)
    assert refused >= 2 and set(codes) <= {200, 429}, codes
    got = eventually(lambda: prom.value(q), lambda v: v == before + refused)
    assert got == before + refused


def test_scheduler_gauges_and_alert_rules(observed: tuple[System, int], prom: Prometheus) -> None:
    assert prom.value('sum(gristmill_workers{state="ready"})') == 2
    assert prom.value('sum(gristmill_model_workers{model="sim"})') == 2
    lag = {r["metric"]["class"] for r in prom.query("gristmill_consumer_lag_messages")}
    assert lag == {"enterprise", "paid", "free", "jobs"}
    ages = prom.query('gristmill_oldest_message_age_seconds{model="sim"}')
    assert {r["metric"]["class"] for r in ages} >= {"enterprise", "paid", "free"}
    assert all(0 <= float(r["value"][1]) < 5 for r in ages)  # nothing left waiting
    assert len(prom.query("gristmill_worker_batches_in_flight")) == 2
    assert prom.value('gristmill_api_result_listener_up{job="gristmill-api"}') == 1
    # read from PostgreSQL (shared by every system of the test session: any count)
    assert prom.value('gristmill_job_items{status="queued"}') is not None
    assert prom.query('gristmill_jobs{status="running"}')
    assert (prom.value('process_cpu_seconds_total{job="gristmill-scheduler"}') or 0) > 0
    # Every rule loaded and evaluated without error against the real series.
    rules = eventually(
        lambda: httpx.get(f"{prom.url}/api/v1/rules", timeout=5).json()["data"]["groups"],
        lambda gs: (
            all(r.get("lastEvaluation", "").startswith("20") for g in gs for r in g["rules"])
            and len(gs) == 2
        ),
    )
    bad = [
        (r["name"], r.get("lastError")) for g in rules for r in g["rules"] if r["health"] != "ok"
    ]
    assert not bad, bad
    slo = prom.query("gristmill:slo_errors:ratio_rate5m")
    assert {r["metric"]["tier"] for r in slo} >= {"paid"}
    ratios = {r["metric"]["tier"]: float(r["value"][1]) for r in slo}
    assert all(math.isnan(v) or 0 <= v <= 1 for v in ratios.values()), slo
    # Only paid has traffic enough for a rate: its 40 answers of the first test. The
    # free tier's one or two admitted requests can read 1 - rate() sees no increase in
    # a series' first sample, and the duration series may first be scraped after them.
    assert ratios["paid"] < 0.5, slo
    firing = prom.query('ALERTS{alertstate="firing",alertname=~"GristmillNo.*"}')
    assert not firing, firing


def test_one_trace_spans_api_scheduler_and_worker(
    observed: tuple[System, int], sink: SpanSink
) -> None:
    system, _ = observed
    trace_id, caller_span = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    r = infer(
        system,
        system.keys["enterprise"],
        "traced request",
        traceparent=f"00-{trace_id}-{caller_span}-01",
    )
    assert r.status_code == 200, r.text
    want = {"gristmill-api", "gristmill-scheduler", "gristmill-worker"}
    spans = eventually(
        lambda: sink.of_trace(trace_id),
        lambda ss: want <= {s["service"] for s in ss} and len(ss) >= 4,
        timeout_s=20,
    )
    by_name = {s["name"]: s for s in spans}
    assert {s["service"] for s in spans} >= want, spans
    api = by_name["POST /v1/infer"]
    schedule, batch, compute = (
        by_name["gristmill.schedule"],
        by_name["gristmill.batch"],
        by_name["gristmill.compute"],
    )
    assert api["service"] == "gristmill-api" and api["parent"] == caller_span
    assert schedule["service"] == "gristmill-scheduler" and schedule["parent"] == api["span_id"]
    assert batch["parent"] == schedule["span_id"]
    assert (trace_id, schedule["span_id"]) in batch["links"]
    assert compute["service"] == "gristmill-worker" and compute["parent"] == batch["span_id"]


def test_spans_carry_the_genai_conventions_on_every_model_route(
    observed: tuple[System, int], sink: SpanSink
) -> None:
    """Decision 55: each route that asks a model has its span, with gen_ai.* beside
    gristmill.*, as a backend that reads vLLM's spans expects."""
    system, _ = observed
    key = system.keys["enterprise"]
    sent: dict[str, str] = {}

    def post(path: str, body: dict[str, Any]) -> None:
        trace_id = uuid.uuid4().hex
        r = httpx.post(
            f"{system.url}{path}",
            json=body,
            headers={
                "Authorization": f"Bearer {key}",
                "traceparent": f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01",
            },
            timeout=60,
        )
        assert r.status_code == 200, r.text
        sent[path] = trace_id

    post("/v1/embeddings", {"model": "all-minilm-l6-v2", "input": ["two short texts", "here"]})
    post("/v1/infer", {"model": "sim", "input": "traced with gen_ai"})
    post(
        "/v2/models/sim/infer",
        {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["kserve"]}]},
    )

    def api_span(path: str, name: str) -> dict[str, Any]:
        spans = eventually(
            lambda: [s for s in sink.of_trace(sent[path]) if s["service"] == "gristmill-api"],
            lambda ss: len(ss) >= 1,
            timeout_s=20,
        )
        (span,) = [s for s in spans if s["name"] == name]
        return span["attrs"]  # type: ignore[no-any-return]

    emb = api_span("/v1/embeddings", "POST /v1/embeddings")
    assert emb["gen_ai.operation.name"] == "embeddings"
    assert emb["gen_ai.request.model"] == "all-minilm-l6-v2"
    assert emb["gen_ai.response.model"].startswith("all-minilm-l6-v2@")
    assert emb["gen_ai.provider.name"] == "gristmill"
    # [CLS] two short texts [SEP] and [CLS] here [SEP]: counted where the API tokenized.
    assert emb["gen_ai.usage.input_tokens"] >= 6
    assert emb["gristmill.tier"] == "enterprise" and emb["gristmill.request_id"]
    native = api_span("/v1/infer", "POST /v1/infer")
    assert native["gen_ai.operation.name"] == "infer" and native["gen_ai.request.model"] == "sim"
    kserve = api_span("/v2/models/sim/infer", "POST /v2/models/{model}/infer")
    assert kserve["gen_ai.operation.name"] == "infer" and kserve["gen_ai.response.model"] == "sim@1"


GENAI_DURATION = (
    'sum(gen_ai_server_request_duration_seconds_count{{gen_ai_operation_name="{op}",'
    'gen_ai_request_model="{model}",error_type="{error}"}})'
)
GENAI_TOKENS = (
    'sum(gen_ai_server_token_usage_{stat}{{gen_ai_operation_name="embeddings",'
    'gen_ai_request_model="all-minilm-l6-v2",gen_ai_token_type="input"}})'
)


def test_genai_metrics_count_every_request_across_the_api_processes(
    observed: tuple[System, int], prom: Prometheus
) -> None:
    """Decision 59: the OpenTelemetry GenAI server metrics, summed over the instance's
    two processes, count each request once by operation and the registry's model; the
    embeddings' input tokens are those the API counted; a refusal is named by its code.
    (Last in the module: its free-tier refusals would start series the SLO rule reads.)"""
    system, _ = observed
    key = system.keys["paid"]
    queries = {
        "infer": GENAI_DURATION.format(op="infer", model="sim", error=""),
        "embeddings": GENAI_DURATION.format(op="embeddings", model="all-minilm-l6-v2", error=""),
        "tokens": GENAI_TOKENS.format(stat="count"),
        "token_sum": GENAI_TOKENS.format(stat="sum"),
        "refused": GENAI_DURATION.format(op="infer", model="sim", error="rate_limited"),
    }
    before = {k: settled(prom, q) for k, q in queries.items()}
    n, e = 24, 3
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda i: infer(system, key, f"g{i}").status_code, range(n)))
    assert codes == [200] * n
    for i in range(e):
        r = httpx.post(
            f"{system.url}/v1/embeddings",
            json={"model": "all-minilm-l6-v2", "input": f"three words {i}"},
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
    limited = new_key(system, "free", rate_rps=0.5, burst=1)
    free = [infer(system, limited, f"r{i}").status_code for i in range(5)]
    refused, served = free.count(429), free.count(200)
    assert refused >= 2 and refused + served == len(free), free
    # The free calls its bucket let through (one, or two on a slow box) are infers too.
    want = {"infer": n + served, "embeddings": e, "tokens": e, "refused": refused}
    for k, add in want.items():
        got = eventually(
            lambda k=k: prom.value(queries[k]), lambda v, k=k, add=add: v == before[k] + add
        )
        assert got == before[k] + add, (k, before[k], got)
    # [CLS] three words <n> [SEP]: at least four tokens an input.
    assert (prom.value(queries["token_sum"]) or 0) - before["token_sum"] >= 4 * e
    # A histogram's quantile reads as a latency: sim answers within seconds.
    p50 = prom.value(
        "histogram_quantile(0.5, sum by (le) (rate(gen_ai_server_request_duration_seconds_bucket"
        '{gen_ai_request_model="sim",error_type=""}[1m])))'
    )
    assert p50 is not None and 0 < p50 < 5, p50
