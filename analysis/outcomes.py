"""The token-in and tool-parse outcomes of a rollout's or a batch's calls, counted in the store:
`Bridging` (bridging.py) and `ToolParsing` (toolparse.py) as the admin API, the rollout service
and the viewer report them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.engine import Connection

from ..store.models import call_table, rollout_table
from .bridging import Bridging
from .toolparse import ToolParsing

if TYPE_CHECKING:
    from ..store.store import Store

C, R = call_table, rollout_table


async def bridging(
    store: Store, *, rollout_id: str | None = None, batch_id: str | None = None
) -> Bridging | None:
    """Token-in outcomes and bridge_break_rate of a rollout or a batch (None: no token-in
    call)."""
    return await store.db.read(read_bridging, rollout_id, batch_id)


async def tool_parsing(
    store: Store, *, rollout_id: str | None = None, batch_id: str | None = None
) -> ToolParsing | None:
    """Tool-call parse outcomes and malformed_call_rate of a rollout or a batch (None: no
    answer's calls were parsed by rolltap or its engine)."""
    return await store.db.read(read_tool_parsing, rollout_id, batch_id)


def read_bridging(
    conn: Connection, rollout_id: str | None, batch_id: str | None
) -> Bridging | None:
    """Token-in outcomes of a rollout's calls, or of every call of a batch's rollouts."""
    query = (
        select(C.c.bridge, func.count())
        .where(C.c.bridge.is_not(None), *_scope(rollout_id, batch_id))
        .group_by(C.c.bridge)
    )
    counts = {str(outcome): int(n) for outcome, n in conn.execute(query)}
    return Bridging(counts) if counts else None


def read_tool_parsing(
    conn: Connection, rollout_id: str | None, batch_id: str | None
) -> ToolParsing | None:
    """Tool-call parse outcomes of a rollout's calls, or of every call of a batch's rollouts."""
    query = select(C.c.tool_parse).where(C.c.tool_parse.is_not(None), *_scope(rollout_id, batch_id))
    return ToolParsing.of(conn.execute(query).scalars())


def bridging_by_batch(conn: Connection, batch_ids: Sequence[str]) -> dict[str, Bridging]:
    """Batch -> the token-in outcomes of its calls (batches without token-in calls left out)."""
    query = (
        select(R.c.batch_id, C.c.bridge, func.count())
        .select_from(C.join(R, C.c.rollout_id == R.c.id))
        .where(R.c.batch_id.in_(list(batch_ids)), C.c.bridge.is_not(None))
        .group_by(R.c.batch_id, C.c.bridge)
    )
    found: dict[str, dict[str, int]] = defaultdict(dict)
    for batch_id, outcome, n in conn.execute(query):
        found[batch_id][str(outcome)] = int(n)
    return {batch_id: Bridging(outcomes) for batch_id, outcomes in found.items()}


def _scope(rollout_id: str | None, batch_id: str | None) -> list[ColumnElement[bool]]:
    """A rollout's calls, or every call of a batch's rollouts."""
    scope: list[ColumnElement[bool]] = []
    if rollout_id is not None:
        scope.append(C.c.rollout_id == rollout_id)
    if batch_id is not None:
        batch = select(R.c.id).where(R.c.batch_id == batch_id).scalar_subquery()
        scope.append(C.c.rollout_id.in_(batch))
    return scope
