"""weight spans and checksums: which weights sampled which tokens, and what the weights were

Revision ID: 5f1c9a2e7d40
Revises: e2a7c4f19b36
Create Date: 2026-12-02 01:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import rolltap.store.models

revision: str = "5f1c9a2e7d40"
down_revision: str | None = "e2a7c4f19b36"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("call", schema=None) as batch_op:
        batch_op.add_column(sa.Column("weight_spans", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("weights_digest", sa.String(length=64), nullable=True))
    op.create_table(
        "weight_checksum",
        sa.Column("id", sa.String(length=26), nullable=False),
        sa.Column("weight_version", sa.String(length=100), nullable=False),
        sa.Column("backend", sa.String(length=300), nullable=False),
        sa.Column("recorded_at", rolltap.store.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column("checksums", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_weight_checksum")),
    )
    with op.batch_alter_table("weight_checksum", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_weight_checksum_weight_version_recorded_at"),
            ["weight_version", "recorded_at"],
        )


def downgrade() -> None:
    with op.batch_alter_table("weight_checksum", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_weight_checksum_weight_version_recorded_at"))
    op.drop_table("weight_checksum")
    with op.batch_alter_table("call", schema=None) as batch_op:
        batch_op.drop_column("weights_digest")
        batch_op.drop_column("weight_spans")
