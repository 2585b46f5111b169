"""call tool_parse

Revision ID: 3c8d2f61a7e5
Revises: 9e4b21c7d3a8
Create Date: 2026-11-26 16:15:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "3c8d2f61a7e5"
down_revision: str | None = "9e4b21c7d3a8"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("call", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tool_parse", sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("call", schema=None) as batch_op:
        batch_op.drop_column("tool_parse")
