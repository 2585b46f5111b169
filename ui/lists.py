"""The list pages: batches, one batch (reward histogram, pass@k, tasks), rollouts with filters."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlencode

from aiohttp import web
from multidict import MultiMapping

from ..analysis.detectors import BUILTIN
from ..runner.summary import current_attempts, summarize
from ..store import RolloutStatus, RolloutView, lookup
from ..store.queries import DRIFT_FILTERS, HACK_FILTERS
from . import charts
from .context import CONTEXT
from .errors import BadQuery

STATUSES = tuple(s.value for s in RolloutStatus)
HACKS = (*HACK_FILTERS, *(factory().name for factory in BUILTIN))
"""The hack filter's choices: flagged by any detector, none, never checked, or by one."""
_DETECTOR = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")
UNBATCHED_SHOWN = 20
"""The newest rollouts in no batch that the index page lists."""


async def batches_page(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    page = _page(request.query)
    size = ctx.settings.page_size
    rows = await ctx.store.batches(
        pass_reward=ctx.settings.pass_reward, limit=size + 1, offset=(page - 1) * size
    )
    # Rollouts made through the proxy alone (POST /admin/rollouts, --open) are in no batch.
    alone, unbatched = (
        await ctx.store.db.read(lookup.unbatched, UNBATCHED_SHOWN) if page == 1 else (0, [])
    )
    return ctx.templates.page(
        "batches.html",
        batches=rows[:size],
        page=page,
        more=len(rows) > size,
        pass_reward=ctx.settings.pass_reward,
        alone=alone,
        unbatched=unbatched,
    )


async def batch_page(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    batch_id = request.match_info["batch_id"]
    rollouts = await ctx.store.rollouts(batch=batch_id, oldest_first=True)
    if not rollouts:
        raise web.HTTPNotFound(text=f"no batch {batch_id!r}")
    current = current_attempts(rollouts)
    seconds = _span_seconds(current)
    summary = summarize(batch_id, current, seconds)
    histogram = charts.histogram([r.reward for r in current])
    return ctx.templates.page(
        "batch.html",
        summary=summary,
        superseded=len(rollouts) - len(current),
        histogram=histogram,
        curve=charts.pass_curve(summary.tasks),
        box=charts.plot_box(),
        size=(charts.WIDTH, charts.HEIGHT),
        hist_ticks=charts.y_ticks(histogram.peak),
        pass_ticks=charts.y_ticks(1.0),
        pass_reward=ctx.settings.pass_reward,
        harnesses=sorted({r.harness for r in current if r.harness}),
        models=sorted({r.model for r in current if r.model}),
    )


@dataclass(frozen=True)
class Filters:
    batch: str | None = None
    task: str | None = None
    harness: str | None = None
    status: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    drift: str | None = None
    hack: str | None = None

    def query(self, **changes: Any) -> str:
        """This filter (with `changes`) as a query string, for links."""
        values = {**asdict(self), **changes}
        return urlencode([(k, _text(v)) for k, v in values.items() if v not in (None, "")])


async def rollouts_page(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    filters = parse_filters(request.query)
    page = _page(request.query)
    size = ctx.settings.page_size
    rows = await ctx.store.rollouts(**asdict(filters), limit=size + 1, offset=(page - 1) * size)
    shown = rows[:size]
    analyses = await ctx.store.analyses([r.id for r in shown])
    return ctx.templates.page(
        "rollouts.html",
        rollouts=shown,
        analyses=analyses,
        filters=filters,
        page=page,
        more=len(rows) > size,
        first=(page - 1) * size + 1,
        statuses=STATUSES,
        drifts=DRIFT_FILTERS,
        hacks=HACKS,
    )


def parse_filters(query: MultiMapping[str]) -> Filters:
    def text(name: str) -> str | None:
        value = query.get(name, "").strip()
        return value or None

    status, drift, hack = text("status"), text("drift"), text("hack")
    if status is not None and status not in STATUSES:
        raise BadQuery(f"status {status!r}: use one of {', '.join(STATUSES)}")
    if drift is not None and drift not in DRIFT_FILTERS:
        raise BadQuery(f"drift {drift!r}: use one of {', '.join(DRIFT_FILTERS)}")
    if hack is not None and not _DETECTOR.match(hack):
        raise BadQuery(f"hack {hack!r}: use one of {', '.join(HACKS)}, or a detector's name")
    return Filters(
        batch=text("batch"),
        task=text("task"),
        harness=text("harness"),
        status=status,
        min_reward=_number(query, "min_reward"),
        max_reward=_number(query, "max_reward"),
        drift=drift,
        hack=hack,
    )


def _number(query: MultiMapping[str], name: str) -> float | None:
    raw = query.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise BadQuery(f"{name} {raw!r} is not a number") from None
    if math.isnan(value):
        raise BadQuery(f"{name} must be a number")
    return value


def _page(query: MultiMapping[str]) -> int:
    raw = query.get("page", "1")
    if not raw.isdigit() or int(raw) < 1 or int(raw) > 1_000_000:
        raise BadQuery(f"page {raw!r} is not a page number")
    return int(raw)


def _text(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _span_seconds(rollouts: list[RolloutView]) -> float:
    starts = [r.started_at or r.created_at for r in rollouts]
    ends = [r.finished_at for r in rollouts if r.finished_at is not None]
    if not starts or not ends:
        return 0.0
    return max(0.0, (max(ends) - min(starts)).total_seconds())
