"""Chart geometry for the server-rendered SVGs: reward histograms, pass@k curves, call timelines.

Everything is computed here in viewBox units; the templates only draw what they are given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from ..runner.summary import TaskSummary, pass_at_k
from ..store import CallView

WIDTH, HEIGHT = 360, 160
"""The charts' viewBox; the plot area leaves room for the axes' labels."""
LEFT, RIGHT, TOP, BOTTOM = 34, 14, 20, 24
BINS = 10


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    count: int
    label: str
    """The bin, as the x axis names it."""


@dataclass(frozen=True)
class Histogram:
    bars: list[Bar]
    peak: int
    total: int
    missing: int
    """Rollouts without a reward."""


@dataclass(frozen=True)
class Curve:
    points: list[tuple[float, float, int, float]]
    """(x, y, k, pass@k) per k."""
    polyline: str


@dataclass(frozen=True)
class Tick:
    at: float
    label: str


def plot_box() -> tuple[float, float, float, float]:
    """(x0, y0, x1, y1) of the plot area."""
    return LEFT, TOP, WIDTH - RIGHT, HEIGHT - BOTTOM


def y_ticks(top: float) -> list[Tick]:
    _, y0, _, y1 = plot_box()
    return [Tick(y1 - (y1 - y0) * f, _short(top * f)) for f in (0.0, 0.5, 1.0)]


def histogram(rewards: Sequence[float | None]) -> Histogram:
    """Binary rewards get two bars (0 and 1); any other rewards ten equal bins over [lo, hi]."""
    values = [r for r in rewards if r is not None and not math.isnan(r)]
    missing = len(rewards) - len(values)
    if not values:
        return Histogram([], 0, 0, missing)
    if set(values) <= {0.0, 1.0}:
        edges_labels = [("0", [v for v in values if v == 0.0]), ("1", [v for v in values if v])]
    else:
        lo, hi = min(0.0, min(values)), max(1.0, max(values))
        step = (hi - lo) / BINS
        bins: list[list[float]] = [[] for _ in range(BINS)]
        for v in values:
            bins[min(BINS - 1, int((v - lo) / step))].append(v)
        edges_labels = [(_short(lo + i * step), b) for i, b in enumerate(bins)]
    x0, y0, x1, y1 = plot_box()
    slot = (x1 - x0) / len(edges_labels)
    peak = max(len(b) for _, b in edges_labels)
    bars = []
    for i, (label, members) in enumerate(edges_labels):
        height = (y1 - y0) * len(members) / peak
        bars.append(
            Bar(x0 + i * slot + slot * 0.1, y1 - height, slot * 0.8, height, len(members), label)
        )
    return Histogram(bars, peak, len(values), missing)


def pass_curve(tasks: Sequence[TaskSummary]) -> Curve:
    """Mean pass@k over the tasks that have at least k samples, for k = 1 .. most samples."""
    counted = [(t.samples, t.passed) for t in tasks if t.samples]
    top = max((n for n, _ in counted), default=0)
    x0, y0, x1, y1 = plot_box()
    points = []
    for k in range(1, top + 1):
        values = [pass_at_k(n, c, k) for n, c in counted if n >= k]
        mean = sum(values) / len(values)
        x = x0 + (x1 - x0) * ((k - 1) / max(1, top - 1) if top > 1 else 0.5)
        points.append((x, y1 - (y1 - y0) * mean, k, mean))
    return Curve(points, " ".join(f"{x:.1f},{y:.1f}" for x, y, _, _ in points))


@dataclass(frozen=True)
class Lane:
    """One call on the rollout's time axis, in 0..1000 units: waiting, to first token, decoding."""

    start: float
    queued: float
    prefill: float
    decode: float


def timeline(calls: Sequence[CallView]) -> dict[str, Lane]:
    if not calls:
        return {}
    t0 = min(c.received_at for c in calls)
    t1 = max(_last(c) for c in calls)
    span = max((t1 - t0).total_seconds(), 1e-3)

    def at(t: datetime) -> float:
        return 1000 * (t - t0).total_seconds() / span

    lanes = {}
    for c in calls:
        received = at(c.received_at)
        dispatched = at(c.dispatched_at) if c.dispatched_at else received
        first = at(c.first_token_at) if c.first_token_at else dispatched
        end = at(_last(c))
        first = min(max(first, dispatched), end)
        lanes[c.id] = Lane(received, dispatched - received, first - dispatched, end - first)
    return lanes


def _last(c: CallView) -> datetime:
    return c.finished_at or c.first_token_at or c.dispatched_at or c.received_at


def _short(value: float) -> str:
    return f"{value:.2g}" if value != int(value) else str(int(value))
