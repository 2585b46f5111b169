"""segment_break.drift may be `answer_dropped`: normal mode names a harness asking again without
the answer it got as token-in mode does (analysis/drift.py).

Revision ID: e2a7c4f19b36
Revises: b8e3d51f6a27
Create Date: 2026-11-26 17:10:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "e2a7c4f19b36"
down_revision: str | None = "b8e3d51f6a27"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = (
    "retokenization",
    "reasoning_stripped",
    "reasoning_inserted",
    "tool_args_reserialized",
    "history_edited",
    "template_glue",
    "text_only",
    "other",
)
_NEW = (*_OLD[:5], "answer_dropped", *_OLD[5:])


def _check(values: Sequence[str]) -> str:
    return f"drift IN ({', '.join(repr(v) for v in values)})"


def _rewrite(values: Sequence[str], updates: Sequence[str] = ()) -> None:
    with op.batch_alter_table("segment_break", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_segment_break_drift"), type_="check")
    for update in updates:
        op.execute(update)
    with op.batch_alter_table("segment_break", schema=None) as batch_op:
        batch_op.create_check_constraint(batch_op.f("ck_segment_break_drift"), _check(values))


def upgrade() -> None:
    _rewrite(_NEW)


def downgrade() -> None:
    _rewrite(_OLD, ["UPDATE segment_break SET drift = 'history_edited' WHERE drift = 'answer_dropped'"])
