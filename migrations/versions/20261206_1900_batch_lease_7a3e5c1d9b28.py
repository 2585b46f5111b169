"""batch lease: which process runs a batch now, so two runs of one batch cannot collide

Revision ID: 7a3e5c1d9b28
Revises: 5f1c9a2e7d40
Create Date: 2026-12-06 19:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import rolltap.store.models

revision: str = "7a3e5c1d9b28"
down_revision: str | None = "5f1c9a2e7d40"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "batch_lease",
        sa.Column("batch_id", sa.String(length=200), nullable=False),
        sa.Column("token", sa.String(length=40), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("process_start", sa.String(length=40), nullable=False),
        sa.Column("acquired_at", rolltap.store.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", rolltap.store.models.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("batch_id", name=op.f("pk_batch_lease")),
    )


def downgrade() -> None:
    op.drop_table("batch_lease")
