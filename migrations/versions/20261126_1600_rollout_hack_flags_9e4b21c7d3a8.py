"""rollout hack flags: what the reward-hack detectors flagged (None: never checked)

Revision ID: 9e4b21c7d3a8
Revises: 5d0c9a7e21b4
Create Date: 2026-11-26 16:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "9e4b21c7d3a8"
down_revision: str | None = "5d0c9a7e21b4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("rollout", schema=None) as batch_op:
        batch_op.add_column(sa.Column("hack_flags", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rollout", schema=None) as batch_op:
        batch_op.drop_column("hack_flags")
