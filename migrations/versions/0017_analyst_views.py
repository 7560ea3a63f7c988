"""Views and time-window functions over the request log for analysts (docs/analysts.md).

Views give one row per thing (a request's stage times, a batch's fill, a refusal count,
a job, a late answer); a filter on their time column reaches the tables' indexes and
partitions. The hourly aggregates are SQL functions of a time window
(``latency_by_hour(since, until)``...): PostgreSQL inlines them, so the window prunes
partitions and uses the indexes, where a view grouped by hour would have to aggregate
the whole log before a filter on its hour could apply.

Revision ID: 0017
Revises: 0016
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

# Milliseconds between two timestamps.
_MS = "extract(epoch FROM ({b}) - ({a})) * 1000"


def ms(a: str, b: str) -> str:
    return _MS.format(a=a, b=b)


VIEWS = {
    "request_timings": f"""
        SELECT r.request_id, r.tenant_id, t.name AS tenant, r.priority AS tier, r.model,
               r.model_version, r.status, r.error, r.job_id, r.item_index, r.batch_id,
               r.batch_size, r.attempts, r.received_at, r.persisted_at, r.deadline_at,
               {ms("r.received_at", "r.consumed_at")} AS queue_ms,
               {ms("r.consumed_at", "r.batched_at")} AS batch_wait_ms,
               {ms("r.batched_at", "r.compute_start_at")} AS dispatch_ms,
               {ms("r.compute_start_at", "r.compute_end_at")} AS compute_ms,
               {ms("r.compute_end_at", "r.persisted_at")} AS persist_ms,
               {ms("r.received_at", "r.persisted_at")} AS total_ms,
               r.persisted_at > r.deadline_at AS after_deadline
        FROM requests r LEFT JOIN tenants t ON t.id = r.tenant_id""",
    "late_answers": f"""
        SELECT a.request_id, a.tenant_id, t.name AS tenant, a.received_at, a.gave_up_at,
               r.persisted_at, r.status, r.model,
               {ms("a.gave_up_at", "r.persisted_at")} AS late_by_ms,
               r.request_id IS NOT NULL AS stored
        FROM answer_timeouts a
        LEFT JOIN requests r ON r.request_id = a.request_id AND r.received_at = a.received_at
        LEFT JOIN tenants t ON t.id = a.tenant_id""",
    "refusal_counts": """
        SELECT f.at, f.tenant_id, t.name AS tenant, f.tier, f.status, f.reason, f.count
        FROM refusals f LEFT JOIN tenants t ON t.id = f.tenant_id""",
    "batch_fill": """
        SELECT b.batch_id, b.model, b.model_version, b.formed_at, b.size, m.max_batch_size,
               b.size::float8 / nullif(m.max_batch_size, 0) AS fill, b.reason, b.worker_id,
               b.status, b.compute_ms
        FROM batches b
        LEFT JOIN models m ON m.name = b.model AND m.version = b.model_version""",
    "job_summaries": f"""
        SELECT j.job_id, j.tenant_id, t.name AS tenant, j.model, j.model_version,
               j.total_items, j.succeeded, j.failed, j.expired, j.cancelled,
               j.total_items - j.succeeded - j.failed - j.expired - j.cancelled AS unfinished,
               CASE WHEN j.cancelled_at IS NOT NULL AND j.finished_at IS NULL THEN 'cancelling'
                    WHEN j.cancelled_at IS NOT NULL THEN 'cancelled'
                    WHEN j.finished_at IS NOT NULL THEN 'finished'
                    WHEN j.expires_at <= now() THEN 'expired'
                    WHEN j.started_at IS NOT NULL THEN 'running'
                    ELSE 'queued' END AS state,
               j.created_at, j.started_at, j.finished_at, j.expires_at,
               {ms("j.created_at", "j.finished_at")} / 1000 AS run_s,
               (j.succeeded + j.failed)
                   / nullif(extract(epoch FROM j.finished_at - j.started_at), 0) AS items_per_s,
               j.output_expires_at, j.output_expired_at
        FROM jobs j LEFT JOIN tenants t ON t.id = j.tenant_id""",
}

_PCT = "percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY {x})"
_WINDOW = "received_at >= since AND received_at < until"
_STAGES = {
    "queue": ("received_at", "consumed_at"),
    "batch_wait": ("consumed_at", "batched_at"),
    "dispatch": ("batched_at", "compute_start_at"),
    "compute": ("compute_start_at", "compute_end_at"),
    "persist": ("compute_end_at", "persisted_at"),
    "total": ("received_at", "persisted_at"),
}

FUNCTIONS = {
    # Latency (received by the API to stored) per tenant, model and hour.
    "latency_by_hour": (
        "tenant_id uuid, model text, hour timestamptz, requests bigint, succeeded bigint, "
        "failed bigint, expired bigint, p50_ms float8, p95_ms float8, p99_ms float8, "
        "max_ms float8",
        f"""
        SELECT tenant_id, model, hour, n, ok, failed, expired, p[1], p[2], p[3], mx
        FROM (
            SELECT tenant_id, model, date_trunc('hour', received_at) AS hour, count(*) AS n,
                   count(*) FILTER (WHERE status = 'succeeded') AS ok,
                   count(*) FILTER (WHERE status = 'failed') AS failed,
                   count(*) FILTER (WHERE status = 'expired') AS expired,
                   {_PCT.format(x=ms("received_at", "persisted_at"))} AS p,
                   max({ms("received_at", "persisted_at")}) AS mx
            FROM requests WHERE {_WINDOW}
            GROUP BY 1, 2, 3
        ) agg""",
    ),
    # Where the time goes: p50 and p95 of each stage per model, tier and hour.
    "stage_breakdown": (
        "model text, tier text, hour timestamptz, requests bigint, "
        + ", ".join(f"{s}_p50_ms float8, {s}_p95_ms float8" for s in _STAGES),
        f"""
        SELECT model, tier, hour, n, {", ".join(f"{s}[1], {s}[2]" for s in _STAGES)}
        FROM (
            SELECT model, priority AS tier, date_trunc('hour', received_at) AS hour,
                   count(*) AS n,
                   {
            ", ".join(
                f"percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY {ms(a, b)}) AS {s}"
                for s, (a, b) in _STAGES.items()
            )
        }
            FROM requests WHERE {_WINDOW} AND status = 'succeeded'
            GROUP BY 1, 2, 3
        ) agg""",
    ),
    # How full batches were, per model, hour and flush reason.
    "batch_fill_by_hour": (
        "model text, model_version text, hour timestamptz, reason text, batches bigint, "
        "items bigint, mean_size float8, mean_fill float8, compute_p50_ms float8",
        """
        SELECT b.model, b.model_version, date_trunc('hour', b.formed_at), b.reason, count(*),
               sum(b.size), avg(b.size),
               avg(b.size::float8 / nullif(m.max_batch_size, 0)),
               percentile_cont(0.5) WITHIN GROUP (ORDER BY b.compute_ms)
        FROM batches b
        LEFT JOIN models m ON m.name = b.model AND m.version = b.model_version
        WHERE b.formed_at >= since AND b.formed_at < until
        GROUP BY 1, 2, 3, 4""",
    ),
    # Refused requests per hour, tier, tenant, status and reason.
    "refusals_by_hour": (
        "hour timestamptz, tier text, tenant_id uuid, tenant text, status smallint, "
        "reason text, refused bigint",
        """
        SELECT date_trunc('hour', f.at), f.tier, f.tenant_id, t.name, f.status, f.reason,
               sum(f.count)
        FROM refusals f LEFT JOIN tenants t ON t.id = f.tenant_id
        WHERE f.at >= since AND f.at < until
        GROUP BY 1, 2, 3, 4, 5, 6""",
    ),
}


def upgrade() -> None:
    for name, body in VIEWS.items():
        op.execute(f"CREATE OR REPLACE VIEW {name} AS {body}")
    for name, (returns, body) in FUNCTIONS.items():
        op.execute(
            f"CREATE OR REPLACE FUNCTION {name}(since timestamptz, until timestamptz) "
            f"RETURNS TABLE ({returns}) LANGUAGE sql STABLE AS $$ {body} $$"
        )


def downgrade() -> None:
    for name in FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS {name}(timestamptz, timestamptz)")
    for name in VIEWS:
        op.execute(f"DROP VIEW IF EXISTS {name}")
