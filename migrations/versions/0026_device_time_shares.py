"""Fairness in device time (decision 65): each batch's device time received and owed per
tier and tenant (``batches.shares``), and two analysts' functions of a time window over
it: ``device_time_by_minute`` (per minute, tier and tenant: device seconds received and
entitled, and both as shares of the tier's) and ``fairness_by_minute`` (per minute and
tier: Jain's index over the tenants' received / entitled). Functions, not views, as the
other aggregates (migration 0017): the window reaches the ``batches_formed`` index
instead of every batch being aggregated first.

Online: one nullable column (no rewrite) and two new functions.

Revision ID: 0026
Revises: 0022
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0026"
down_revision = "0022"
branch_labels = None
depends_on = None

FUNCTIONS = {
    "device_time_by_minute": (
        "minute timestamptz, tier text, tenant_id text, tenant text, received_s float8, "
        "entitled_s float8, received_share float8, entitled_share float8",
        """
        SELECT minute, tier, tenant_id, tenant, received_s, entitled_s,
               received_s / nullif(sum(received_s) OVER w, 0),
               entitled_s / nullif(sum(entitled_s) OVER w, 0)
        FROM (
            SELECT date_trunc('minute', b.formed_at) AS minute, c.key AS tier,
                   t.key AS tenant_id, max(tn.name) AS tenant,
                   sum((t.value ->> 0)::float8) / 1000 AS received_s,
                   sum((t.value ->> 1)::float8) / 1000 AS entitled_s
            FROM batches b
            CROSS JOIN LATERAL jsonb_each(b.shares) c
            CROSS JOIN LATERAL jsonb_each(c.value) t
            LEFT JOIN tenants tn ON tn.id::text = t.key
            WHERE b.formed_at >= since AND b.formed_at < until AND b.shares IS NOT NULL
            GROUP BY 1, 2, 3
        ) per_tenant
        WINDOW w AS (PARTITION BY minute, tier)""",
    ),
    "fairness_by_minute": (
        "minute timestamptz, tier text, tenants bigint, received_s float8, fairness_index float8",
        """
        SELECT minute, tier, count(*), sum(received_s),
               power(sum(received_s / entitled_s), 2)
                   / nullif(count(*) * sum(power(received_s / entitled_s, 2)), 0)
        FROM device_time_by_minute(since, until)
        WHERE entitled_s > 0
        GROUP BY minute, tier""",
    ),
}


def upgrade() -> None:
    op.add_column("batches", sa.Column("shares", JSONB))
    for name, (returns, body) in FUNCTIONS.items():
        op.execute(
            f"CREATE OR REPLACE FUNCTION {name}(since timestamptz, until timestamptz) "
            f"RETURNS TABLE ({returns}) LANGUAGE sql STABLE AS $$ {body} $$"
        )


def downgrade() -> None:
    for name in reversed(list(FUNCTIONS)):
        op.execute(f"DROP FUNCTION IF EXISTS {name}(timestamptz, timestamptz)")
    op.drop_column("batches", "shares")
