"""The durability ledger's tables (gristmill/ledger/, decision 54).

``ledger_partitions`` (where a ledger group stands on each request-topic partition),
``ledger_counts`` (counted messages by tenant and minute), ``ledger_pending`` (read, not
yet counted) and ``ledger_missing`` (each message found without its terminal row).

Online: new tables only; nothing existing is locked or rewritten.

Revision ID: 0021
Revises: 0020
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "ledger_partitions",
        sa.Column("consumer_group", sa.Text, primary_key=True),
        sa.Column("topic", sa.Text, primary_key=True),
        sa.Column("partition", sa.Integer, primary_key=True),
        sa.Column("next_offset", sa.BigInteger, nullable=False),
        sa.Column("settled_through", _TS),
        sa.Column("updated_at", _TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "ledger_counts",
        sa.Column("consumer_group", sa.Text, primary_key=True),
        sa.Column("tenant_id", UUID(as_uuid=False), primary_key=True),
        sa.Column("minute", _TS, primary_key=True),
        sa.Column("accepted", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("terminal", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("missing", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("duplicate", sa.BigInteger, nullable=False, server_default="0"),
    )
    op.create_table(
        "ledger_pending",
        sa.Column("consumer_group", sa.Text, primary_key=True),
        sa.Column("topic", sa.Text, primary_key=True),
        sa.Column("partition", sa.Integer, primary_key=True),
        sa.Column("tenant_id", UUID(as_uuid=False), primary_key=True),
        sa.Column("minute", _TS, primary_key=True),
        sa.Column("pending", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "ledger_missing",
        sa.Column("consumer_group", sa.Text, primary_key=True),
        sa.Column("topic", sa.Text, primary_key=True),
        sa.Column("partition", sa.Integer, primary_key=True),
        sa.Column("kafka_offset", sa.BigInteger, primary_key=True),
        sa.Column("request_id", UUID(as_uuid=False), nullable=False),
        sa.Column("tenant_id", UUID(as_uuid=False), nullable=False),
        sa.Column("received_at", _TS, nullable=False),
        sa.Column("found_at", _TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ledger_missing_tenant", "ledger_missing", ["tenant_id", "received_at"])


def downgrade() -> None:
    op.drop_index("ledger_missing_tenant", table_name="ledger_missing")
    for t in ("ledger_missing", "ledger_pending", "ledger_counts", "ledger_partitions"):
        op.drop_table(t)
