"""Rows as a person names them: a unique prefix of a rollout, batch or call id stands for the
id (`rolltap show 01K8C4`), and rollouts no batch holds (made by hand through the admin API)."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from . import listing
from .listing import Kind as Kind
from .models import rollout_table
from .queries import _rollout_view, _rollouts, text_select
from .records import RolloutView


def resolve_id(conn: Connection, kind: Kind, given: str) -> str:
    """The id `given` is, or the only one it begins (listing.resolve_id)."""
    return listing.resolve_id(text_select(conn), kind, given)


def unbatched(conn: Connection, limit: int) -> tuple[int, list[RolloutView]]:
    """How many rollouts belong to no batch, and the newest `limit` of them."""
    alone = rollout_table.c.batch_id.is_(None)
    n = conn.execute(select(func.count()).select_from(rollout_table).where(alone)).scalar_one()
    newest = _rollouts().where(alone).order_by(rollout_table.c.created_at.desc()).limit(limit)
    return int(n), [_rollout_view(row) for row in conn.execute(newest)]
