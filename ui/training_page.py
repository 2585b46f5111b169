"""The training view's page: `/training` lists the rollout-service sessions and batch labels a
run can be picked by; `/training?session=S` (or `label=key=value`, repeatable, or `batch=ID`,
repeatable; given together they all apply) shows the run per policy version, in charts and a
table (the figures: ui/training.py)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ..store.models import MetricsSource
from ..store.training import metrics_of, sessions
from . import charts
from .context import CONTEXT
from .training import Run, label_text, parse_selection, read_run
from .trends import LineChart, StackedBars, line_chart, stacked_bars

LABELS_SHOWN = 40


@dataclass(frozen=True)
class RunCharts:
    reward: LineChart
    groups: StackedBars
    staleness: LineChart
    bridge: LineChart
    mismatch: LineChart
    seconds: StackedBars


async def training_page(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    selection = parse_selection(request.query)
    common: dict[str, Any] = {
        "box": charts.plot_box(),
        "size": (charts.WIDTH, charts.HEIGHT),
        "pass_reward": ctx.settings.pass_reward,
    }
    if selection.empty:
        service = await ctx.store.db.read(metrics_of, None, source=MetricsSource.SERVICE)
        latest = {r.batch_id: r for r in service}
        counted = Counter(
            (key, label_text(value))
            for r in latest.values()
            for key, value in (r.metrics.get("labels") or {}).items()
        )
        return ctx.templates.page(
            "training.html",
            run=None,
            selection=selection,
            sessions=await ctx.store.db.read(sessions),
            labels=sorted(counted.items())[:LABELS_SHOWN],
            **common,
        )
    run = await read_run(ctx.store, selection, ctx.settings.pass_reward)
    return ctx.templates.page(
        "training.html",
        run=run,
        selection=selection,
        charts=run_charts(run),
        **common,
    )


def run_charts(run: Run) -> RunCharts:
    versions, rows = run.versions, run.rows
    rewards = [r.mean_reward for r in rows if r.mean_reward is not None]
    gaps = [float(r.staleness.max) for r in rows if r.staleness and r.staleness.max is not None]
    return RunCharts(
        reward=line_chart(
            versions,
            {
                "mean reward": [r.mean_reward for r in rows],
                "pass@1": [r.pass_at_1 for r in rows],
                "pass@k": [r.pass_at_k for r in rows],
            },
            top=max([1.0, *rewards]),
            shown=_short,
        ),
        groups=stacked_bars(
            versions,
            {
                "kept": [r.kept for r in rows],
                **{
                    f"dropped: {reason}": [(r.dropped or {}).get(reason) for r in rows]
                    for reason in run.drop_reasons
                },
            },
            shown=lambda v: f"{v:.0f}",
        ),
        staleness=line_chart(
            versions,
            {
                "mean": [r.staleness.mean if r.staleness else None for r in rows],
                "max": [
                    None if r.staleness is None or r.staleness.max is None else r.staleness.max
                    for r in rows
                ],
            },
            top=max([1.0, *gaps]),
            shown=_short,
        ),
        bridge=line_chart(
            versions,
            {
                "bridge break rate": [
                    r.bridging.bridge_break_rate if r.bridging else None for r in rows
                ]
            },
            top=1.0,
            shown=lambda v: f"{v:.1%}",
        ),
        mismatch=line_chart(
            versions,
            {"max": [r.mismatch_max for r in rows], "mean": [r.mismatch_mean for r in rows]},
            log=True,
            shown=lambda v: f"{v:.1e}",
        ),
        seconds=stacked_bars(
            versions,
            {phase: [r.seconds.get(phase) for r in rows] for phase in run.phases},
            shown=lambda v: f"{v:.1f}",
        ),
    )


def _short(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))
