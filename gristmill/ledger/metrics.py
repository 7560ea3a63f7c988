"""The ledger's Prometheus metrics, in a registry of its own on its own port
(``GRISTMILL_LEDGER_METRICS_PORT``, 9465). docs/observability.md lists them; the alerts
on them are in deploy/prometheus/alerts.yaml."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from gristmill.ledger.policy import AGE_BOUNDS, State, Unreconciled

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry()

UNRECONCILED = Gauge(
    "gristmill_ledger_unreconciled",
    "Accepted requests read by the ledger without a terminal row yet, by age since they "
    "were received (le: the bucket's upper bound in seconds, not cumulative)",
    ["le"],
    registry=REGISTRY,
)
OVERDUE = Gauge(
    "gristmill_ledger_overdue",
    "Accepted requests past their deadline plus the grace without a terminal row",
    registry=REGISTRY,
)
OLDEST = Gauge(
    "gristmill_ledger_oldest_unreconciled_seconds",
    "Age of the oldest accepted request without a terminal row",
    registry=REGISTRY,
)
MESSAGES = Counter(
    "gristmill_ledger_messages_total",
    "Request messages the ledger counted, by outcome: terminal, duplicate (another copy "
    "of the request holds its row), missing (below the scheduler's committed offset "
    "without a row: lost), unreadable (names no request)",
    ["outcome"],
    registry=REGISTRY,
)
LAG = Gauge(
    "gristmill_ledger_lag_messages",
    "Messages in the request topics the ledger has not read yet",
    registry=REGISTRY,
)
LAST_STORE = Gauge(
    "gristmill_ledger_last_store_timestamp_seconds",
    "When the ledger last stored its counts (Unix time)",
    registry=REGISTRY,
)

for _s in (State.TERMINAL, State.DUPLICATE, State.MISSING, State.UNREADABLE):
    MESSAGES.labels(_s.value)  # every outcome exported from the start, at 0


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else f"{bound:g}"


def show(u: Unreconciled, lag: int) -> None:
    for bound in AGE_BOUNDS:
        UNRECONCILED.labels(_le(bound)).set(u.by_age.get(bound, 0))
    OVERDUE.set(u.overdue)
    OLDEST.set(u.oldest_s)
    LAG.set(lag)


def counted(outcomes: dict[State, int], at: float) -> None:
    for st, n in outcomes.items():
        MESSAGES.labels(st.value).inc(n)
    LAST_STORE.set(at)


def serve(host: str, port: int) -> None:
    if port == 0:
        return
    try:
        start_http_server(port, host, registry=REGISTRY)
    except OSError as e:  # a port taken: the ledger runs on, unseen, and says so
        log.error("ledger metrics not served on %s:%d: %s", host, port, e)
