"""deploy/grafana/gristmill.json asks only for metrics the code exports, and so does
the dashboard page's publication (core/metrics_window.py).

The exported names are read from the real registries: the API's, the scheduler's with
its scrape-time gauges built from a hand-made state, and the job gauges; then the
sample names each family gives (``_total``, ``_bucket``, ...) as Prometheus stores them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from core.metrics import parse_exposition
from core.metrics_window import API_SERIES, SCHEDULER_SERIES
from core.vocab import ModelRef
from gristmill.devservices.stack import REPO
from ingest.operations import metrics as api_metrics
from results.metrics import JobGauges
from scheduler.runtime import metrics as scheduler_metrics

DASHBOARD = REPO / "deploy" / "grafana" / "gristmill.json"

SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "gauge": ("",),
    "untyped": ("",),
    "info": ("_info",),
}


class _Families(Collector):
    def __init__(self, families: list[Any]):
        self.families = families

    def collect(self) -> Iterator[Any]:
        return iter(self.families)


def exported() -> set[str]:
    """Every sample name the API and the scheduler can export."""
    ref = ModelRef("sim", "1")
    state = scheduler_metrics.SchedulerState(
        now=10.0,
        served={ref},
        queued={(ref, 0): 1},
        oldest={(ref, 0): 9.0},
        lag={"paid": 3},
        paused=set(),
        in_flight={"w1": 1},
        workers={"w1": {ref}},
        warming=0,
    )
    gauges = CollectorRegistry()
    gauges.register(
        _Families(
            [
                *scheduler_metrics.gauge_families(state),
                *scheduler_metrics.device_families(
                    {
                        "w1": (
                            {
                                "gpu": "0",
                                "utilization": 0.5,
                                "memory_used_bytes": 1.0,
                                "memory_total_bytes": 2.0,
                            },
                            0.0,
                        )
                    },
                    now=0.0,
                ),
            ]
        )
    )
    names: set[str] = set()
    for registry in (
        api_metrics.api_registry(JobGauges({"running": 1}, {"queued": 1})),
        scheduler_metrics.REGISTRY,
        gauges,
    ):
        for family in registry.collect():
            names |= {family.name + s for s in SUFFIXES[family.type]}
    return names


def test_exported_names_read_back_from_an_exposition() -> None:
    # The families above are what a scrape gives: parse one and find its names among them.
    text = generate_latest(scheduler_metrics.REGISTRY).decode()
    scraped = set(parse_exposition(text).samples)
    assert scraped and scraped <= exported()


# ---- PromQL -------------------------------------------------------------------------------
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "offset", "bool", "inf", "nan",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (functions, keywords, labels, strings,
    ranges and Grafana variables left out)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    e = re.sub(r"\$\{?\w+\}?", "", e)  # $__rate_interval, ${datasource}
    e = re.sub(r"\{[^}]*\}", "", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # ranges
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word = m.group(0)
        rest = e[m.end() :].lstrip()
        if word.lower() in KEYWORDS or rest.startswith("("):
            continue
        if re.fullmatch(r"\d.*", word):
            continue
        names.add(word)
    return names


def test_metric_names_of_promql() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le, stage) (rate(gristmill_stage_duration_seconds_bucket"
        '{model=~"$model", stage!="x y"}[$__rate_interval]))) / on(worker) group_left '
        "max without (gpu) (gristmill_gpu_memory_total_bytes) > bool 0"
    )
    assert metric_names(expr) == {
        "gristmill_stage_duration_seconds_bucket",
        "gristmill_gpu_memory_total_bytes",
    }
    assert metric_names("label_values(gristmill_model_workers, model)") == {
        "gristmill_model_workers",
        "model",  # the label argument of Grafana's label_values: checked apart
    }


def expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def test_every_grafana_expression_names_exported_metrics_only() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    have = exported()
    exprs = list(expressions(dashboard))
    assert len(exprs) >= 20
    used: set[str] = set()
    for title, expr in exprs:
        names = metric_names(expr)
        assert names, (title, expr)
        missing = names - have
        assert not missing, (title, expr, missing)
        used |= names
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"]
            m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
            assert m and m.group(1) in have, query
    # The page's subjects are all on the Grafana dashboard too.
    for name in (
        "gristmill_api_responses_total",
        "gristmill_requests_finished_total",
        "gristmill_stage_duration_seconds_bucket",
        "gristmill_request_duration_seconds_bucket",
        "gristmill_requests_queued",
        "gristmill_consumer_lag_messages",
        "gristmill_admission_total",
        "gristmill_worker_busy_seconds_total",
        "gristmill_jobs",
    ):
        assert name in used, name


def test_the_dashboard_page_publishes_exported_metrics_only() -> None:
    have = exported()
    for series in (*API_SERIES, *SCHEDULER_SERIES):
        assert series.name in have, series.name
