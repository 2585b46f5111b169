"""call bridge

Revision ID: 5b2e7c1d9a40
Revises: 27f8568b2e45
Create Date: 2026-11-23 20:45:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5b2e7c1d9a40"
down_revision: str | None = "27f8568b2e45"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("call", schema=None) as batch_op:
        batch_op.add_column(sa.Column("bridge", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("call", schema=None) as batch_op:
        batch_op.drop_column("bridge")
