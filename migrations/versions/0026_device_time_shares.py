"""Fairness in device time (decision 65): each batch's device time received and owed per
tier and tenant (``batches.shares``), and two analysts' views over it:
``tenant_device_time`` (per minute, tier and tenant: GPU-seconds received and entitled,
and both as shares of the tier's) and ``tier_fairness`` (per minute and tier: Jain's
index over the tenants' received / entitled).

Online: one nullable column (no rewrite) and two new views.

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

TENANT_DEVICE_TIME = """
    SELECT minute, tier, tenant_id, tenant, received_s, entitled_s,
           received_s / nullif(sum(received_s) OVER w, 0) AS received_share,
           entitled_s / nullif(sum(entitled_s) OVER w, 0) AS entitled_share
    FROM (
        SELECT date_trunc('minute', b.compute_end_at) AS minute, c.key AS tier,
               t.key AS tenant_id, max(tn.name) AS tenant,
               sum((t.value ->> 0)::float8) / 1000 AS received_s,
               sum((t.value ->> 1)::float8) / 1000 AS entitled_s
        FROM batches b
        CROSS JOIN LATERAL jsonb_each(b.shares) c
        CROSS JOIN LATERAL jsonb_each(c.value) t
        LEFT JOIN tenants tn ON tn.id::text = t.key
        WHERE b.shares IS NOT NULL
        GROUP BY 1, 2, 3
    ) per_tenant
    WINDOW w AS (PARTITION BY minute, tier)"""

TIER_FAIRNESS = """
    SELECT minute, tier, count(*) AS tenants, sum(received_s) AS received_s,
           power(sum(received_s / entitled_s), 2)
               / (count(*) * sum(power(received_s / entitled_s, 2))) AS fairness_index
    FROM tenant_device_time
    WHERE entitled_s > 0
    GROUP BY minute, tier"""


def upgrade() -> None:
    op.add_column("batches", sa.Column("shares", JSONB))
    op.execute(f"CREATE VIEW tenant_device_time AS {TENANT_DEVICE_TIME}")
    op.execute(f"CREATE VIEW tier_fairness AS {TIER_FAIRNESS}")


def downgrade() -> None:
    op.execute("DROP VIEW tier_fairness")
    op.execute("DROP VIEW tenant_device_time")
    op.drop_column("batches", "shares")
