"""batch metrics: what the trainer posts about a batch, and what the rollout service recorded

Revision ID: b8e3d51f6a27
Revises: 3c8d2f61a7e5
Create Date: 2026-11-26 17:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import rolltap.store.models

revision: str = "b8e3d51f6a27"
down_revision: str | None = "3c8d2f61a7e5"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "batch_metrics",
        sa.Column("id", sa.String(length=26), nullable=False),
        sa.Column("batch_id", sa.String(length=200), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("policy_version", sa.String(length=100), nullable=True),
        sa.Column("session", sa.String(length=26), nullable=True),
        sa.Column("posted_at", rolltap.store.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.CheckConstraint(
            "source IN ('trainer', 'service')", name=op.f("ck_batch_metrics_source")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batch_metrics")),
    )
    with op.batch_alter_table("batch_metrics", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_batch_metrics_batch_id_posted_at"), ["batch_id", "posted_at"]
        )
        batch_op.create_index(batch_op.f("ix_batch_metrics_session"), ["session"])


def downgrade() -> None:
    with op.batch_alter_table("batch_metrics", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_batch_metrics_session"))
        batch_op.drop_index(batch_op.f("ix_batch_metrics_batch_id_posted_at"))
    op.drop_table("batch_metrics")
