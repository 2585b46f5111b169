"""Rows as a person names them: a unique prefix of a rollout, batch or call id stands for the
id (`rolltap show 01K8C4`), and rollouts no batch holds (made by hand through the admin API)."""

from __future__ import annotations

from typing import Literal

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from .errors import AmbiguousId, NotFound
from .models import call_table, rollout_table
from .queries import _rollout_view, _rollouts
from .records import RolloutView

Kind = Literal["rollout", "batch", "call"]

_COLUMNS = {
    "rollout": rollout_table.c.id,
    "batch": rollout_table.c.batch_id,
    "call": call_table.c.id,
}
_SHOWN = 3
"""How many of the ids an ambiguous prefix matches the error names."""


def resolve_id(conn: Connection, kind: Kind, given: str) -> str:
    """The id `given` is, or the only one it begins; NotFound when none, AmbiguousId when several.
    Rollout and call ids (ULIDs, upper case) also match a prefix typed in lower case."""
    column = _COLUMNS[kind]
    if given and conn.execute(select(column).where(column == given).limit(1)).first():
        return given
    spellings = [given] if kind == "batch" else list(dict.fromkeys((given, given.upper())))
    for prefix in spellings if given else []:
        begins = func.substr(column, 1, len(prefix)) == prefix
        found = list(
            conn.execute(
                select(column).where(begins).distinct().order_by(column).limit(_SHOWN + 1)
            ).scalars()
        )
        if len(found) == 1:
            return str(found[0])
        if found:
            n = conn.execute(select(func.count(func.distinct(column))).where(begins)).scalar_one()
            shown = ", ".join(found[:_SHOWN]) + (", ..." if n > _SHOWN else "")
            raise AmbiguousId(
                f"{given!r} begins {n} {kind} ids ({shown}): give more of the {kind} id"
            )
    raise NotFound(f"no {kind} {given!r}")


def unbatched(conn: Connection, limit: int) -> tuple[int, list[RolloutView]]:
    """How many rollouts belong to no batch, and the newest `limit` of them."""
    alone = rollout_table.c.batch_id.is_(None)
    n = conn.execute(select(func.count()).select_from(rollout_table).where(alone)).scalar_one()
    newest = _rollouts().where(alone).order_by(rollout_table.c.created_at.desc()).limit(limit)
    return int(n), [_rollout_view(row) for row in conn.execute(newest)]
