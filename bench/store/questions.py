"""The analysts' questions and their SQL, as docs/analysts.md gives them.

Each is run by bench/store/growth.py at every size of the log (EXPLAIN ANALYZE), and
tests/unit/bench/test_questions.py checks that docs/analysts.md shows the same SQL, so
the documented queries are the measured ones. Parameters are ``%(name)s``; the doc
writes them ``:name``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Question:
    key: str
    ask: str
    sql: str


QUESTIONS: tuple[Question, ...] = (
    Question(
        "latency_by_tenant_hour",
        "What were one tenant's p50/p95/p99 latencies per model, hour by hour, over a day?",
        """SELECT model, hour, requests, p50_ms, p95_ms, p99_ms
FROM latency_by_hour(%(day_start)s, %(day_end)s)
WHERE tenant_id = %(tenant)s
ORDER BY model, hour""",
    ),
    Question(
        "stage_breakdown_hour",
        "Where did requests spend their time in one hour (p50/p95 of each stage)?",
        """SELECT model, tier, requests, queue_p95_ms, batch_wait_p95_ms, dispatch_p95_ms,
       compute_p95_ms, persist_p95_ms, total_p95_ms
FROM stage_breakdown(%(hour_start)s, %(hour_end)s)
ORDER BY model, tier""",
    ),
    Question(
        "slowest_in_hour",
        "Which requests were the slowest in one hour, and which stage made them slow?",
        """SELECT request_id, tenant, model, total_ms, queue_ms, batch_wait_ms, compute_ms,
       persist_ms
FROM request_timings
WHERE received_at >= %(hour_start)s AND received_at < %(hour_end)s
ORDER BY total_ms DESC
LIMIT 20""",
    ),
    Question(
        "batch_fill_day",
        "How full were batches per model and hour, and why were they flushed?",
        """SELECT model, hour, reason, batches, mean_size, mean_fill
FROM batch_fill_by_hour(%(day_start)s, %(day_end)s)
ORDER BY model, hour, reason""",
    ),
    Question(
        "refused_last_hour",
        "Who was refused in one hour, and why (tier, tenant, status, reason)?",
        """SELECT tier, tenant, status, reason, sum(count) AS refused
FROM refusal_counts
WHERE at >= %(hour_start)s AND at < %(hour_end)s
GROUP BY tier, tenant, status, reason
ORDER BY refused DESC""",
    ),
    Question(
        "shed_by_tier_day",
        "How much did we shed over a day, by tier and reason?",
        """SELECT tier, reason, sum(refused) AS refused
FROM refusals_by_hour(%(day_start)s, %(day_end)s)
WHERE status = 503
GROUP BY tier, reason
ORDER BY refused DESC""",
    ),
    Question(
        "late_answers_day",
        "Which 504s got their result stored later, and how late?",
        """SELECT request_id, tenant, model, gave_up_at, persisted_at, late_by_ms
FROM late_answers
WHERE received_at >= %(day_start)s AND received_at < %(day_end)s AND stored
ORDER BY late_by_ms DESC
LIMIT 20""",
    ),
    Question(
        "one_request",
        "Everything about one request, by its id.",
        """SELECT * FROM request_timings WHERE request_id = %(request_id)s""",
    ),
    Question(
        "one_vector",
        "The vector one request was answered with, as real[].",
        """SELECT gristmill_vector(output_vector) AS embedding
FROM requests
WHERE request_id = %(request_id)s""",
    ),
    Question(
        "job_summary",
        "A job's progress, throughput and output expiry.",
        """SELECT state, total_items, succeeded, failed, unfinished, run_s, items_per_s,
       output_expires_at
FROM job_summaries
WHERE job_id = %(job_id)s""",
    ),
    Question(
        "job_slowest_items",
        "A job's slowest items and where their time went.",
        """SELECT item_index, status, total_ms, queue_ms, batch_wait_ms, compute_ms
FROM request_timings
WHERE job_id = %(job_id)s
ORDER BY total_ms DESC
LIMIT 10""",
    ),
    Question(
        "tenant_hour_requests",
        "One tenant's requests in one hour, in order.",
        """SELECT request_id, model, status, total_ms
FROM request_timings
WHERE tenant_id = %(tenant)s AND received_at >= %(hour_start)s AND received_at < %(hour_end)s
ORDER BY received_at""",
    ),
    Question(
        "errors_by_model_hour",
        "Which errors did each model return in one hour, and how often?",
        """SELECT model, status, error, count(*) AS requests
FROM requests
WHERE received_at >= %(hour_start)s AND received_at < %(hour_end)s
  AND status <> 'succeeded'
GROUP BY model, status, error
ORDER BY requests DESC
LIMIT 20""",
    ),
    Question(
        "top_tenants_hour",
        "Which tenants sent the most requests in one hour?",
        """SELECT tenant_id, count(*) AS requests,
       count(*) FILTER (WHERE status <> 'succeeded') AS not_succeeded
FROM requests
WHERE received_at >= %(hour_start)s AND received_at < %(hour_end)s
GROUP BY tenant_id
ORDER BY requests DESC
LIMIT 10""",
    ),
)


def as_documented(sql: str) -> str:
    """The SQL as docs/analysts.md writes it: ``:name`` for ``%(name)s``."""
    return re.sub(r"%\((\w+)\)s", r":\1", sql)
