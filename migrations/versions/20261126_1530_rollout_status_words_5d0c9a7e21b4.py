"""rollout status words: `succeeded` becomes `finished` (the harness ended and the verifier
gave a reward, which may be 0: whether the task passed is the reward's verdict), and rollouts
nobody finished can end `expired`.

Revision ID: 5d0c9a7e21b4
Revises: 4114d9510933
Create Date: 2026-11-26 15:30:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "5d0c9a7e21b4"
down_revision: str | None = "4114d9510933"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = ("pending", "running", "succeeded", "failed", "timed_out", "cancelled", "budget_exceeded")
_NEW = (
    "pending",
    "running",
    "finished",
    "failed",
    "timed_out",
    "cancelled",
    "budget_exceeded",
    "expired",
)


def _check(values: Sequence[str]) -> str:
    return f"status IN ({', '.join(repr(v) for v in values)})"


def _rewrite(old: Sequence[str], new: Sequence[str], updates: Sequence[str]) -> None:
    with op.batch_alter_table("rollout", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("ck_rollout_status"), type_="check")
    for update in updates:
        op.execute(update)
    with op.batch_alter_table("rollout", schema=None) as batch_op:
        batch_op.create_check_constraint(batch_op.f("ck_rollout_status"), _check(new))


def upgrade() -> None:
    _rewrite(_OLD, _NEW, ["UPDATE rollout SET status = 'finished' WHERE status = 'succeeded'"])


def downgrade() -> None:
    _rewrite(
        _NEW,
        _OLD,
        [
            "UPDATE rollout SET status = 'succeeded' WHERE status = 'finished'",
            "UPDATE rollout SET status = 'cancelled' WHERE status = 'expired'",
        ],
    )
