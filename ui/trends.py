"""Chart geometry over a run's policy versions (the training view): lines, one point per
version and series, and stacked bars, one bar per version. In the viewBox units of charts.py;
the template only draws what it is given."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .charts import Tick, plot_box

SERIES = 6
"""Distinct series colours (ui.css: .s0 .. .s5); more series reuse them."""


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    version: str
    value: float
    label: str


@dataclass(frozen=True)
class Line:
    name: str
    css: str
    points: list[Point]
    path: str
    """An SVG path through runs of consecutive points: a version without a value breaks it."""


@dataclass(frozen=True)
class LineChart:
    lines: list[Line]
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    log: bool

    @property
    def empty(self) -> bool:
        return not any(line.points for line in self.lines)


@dataclass(frozen=True)
class Segment:
    x: float
    y: float
    width: float
    height: float
    name: str
    css: str
    value: float
    version: str
    label: str


@dataclass(frozen=True)
class StackedBars:
    bars: list[list[Segment]]
    """Per version, its parts bottom to top."""
    totals: list[tuple[float, float, str]]
    """Per version with a bar: (x of its centre, y of its top, its total as shown)."""
    names: list[tuple[str, str]]
    """(name, css) of each part, for the legend."""
    x_ticks: list[Tick]
    y_ticks: list[Tick]

    @property
    def empty(self) -> bool:
        return not any(self.bars)


def x_positions(count: int) -> list[float]:
    """The centre of each version's slot, left to right."""
    x0, _, x1, _ = plot_box()
    slot = (x1 - x0) / max(count, 1)
    return [x0 + slot * (i + 0.5) for i in range(count)]


def line_chart(
    versions: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    *,
    top: float | None = None,
    log: bool = False,
    shown: Callable[[float], str] = str,
) -> LineChart:
    """`series`: name -> one value per version (None: none). `top`: the y axis's top (else the
    largest value); `log`: a log10 axis over the decades the positive values span; `shown`:
    a value as its point's label says it."""
    xs = x_positions(len(versions))
    values = [v for vs in series.values() for v in vs if v is not None and math.isfinite(v)]
    if log:
        values = [v for v in values if v > 0]
    _, y0, _, y1 = plot_box()
    if log and values:
        lo = math.floor(math.log10(min(values)))
        hi = max(math.ceil(math.log10(max(values))), lo + 1)

        def y_of(v: float) -> float:
            return y1 - (y1 - y0) * (math.log10(v) - lo) / (hi - lo)

        ticks = [Tick(y_of(10.0**e), f"1e{e}") for e in _decades(lo, hi)]
    else:
        peak = top if top is not None else max(values, default=1.0)
        peak = peak if peak > 0 else 1.0

        def y_of(v: float) -> float:
            return y1 - (y1 - y0) * min(max(v, 0.0), peak) / peak

        ticks = [Tick(y1 - (y1 - y0) * f, _label(peak * f)) for f in (0.0, 0.5, 1.0)]
    lines = []
    for i, (name, vs) in enumerate(series.items()):
        points: list[Point] = []
        runs: list[list[str]] = [[]]
        for x, version, v in zip(xs, versions, vs, strict=True):
            if v is None or not math.isfinite(v) or (log and v <= 0):
                runs.append([])
                continue
            point = Point(x, y_of(v), version, v, shown(v))
            points.append(point)
            runs[-1].append(f"{point.x:.1f},{point.y:.1f}")
        path = " ".join("M " + " L ".join(run) for run in runs if len(run) > 1)
        lines.append(Line(name, f"s{i % SERIES}", points, path))
    return LineChart(lines, _x_ticks(versions, xs), ticks, log and bool(values))


def stacked_bars(
    versions: Sequence[str],
    parts: Mapping[str, Sequence[float | None]],
    shown: Callable[[float], str] = str,
) -> StackedBars:
    """`parts`: name -> one value per version (None or 0: no such part), stacked in order."""
    xs = x_positions(len(versions))
    totals = [sum(vs[i] or 0.0 for vs in parts.values()) for i in range(len(versions))]
    peak = max(totals, default=0.0) or 1.0
    x0, y0, x1, y1 = plot_box()
    width = (x1 - x0) / max(len(versions), 1) * 0.6
    bars: list[list[Segment]] = []
    tops: list[tuple[float, float, str]] = []
    for i, (x, version) in enumerate(zip(xs, versions, strict=True)):
        base = y1
        stack = []
        for j, (name, vs) in enumerate(parts.items()):
            value = vs[i] or 0.0
            if value <= 0:
                continue
            height = (y1 - y0) * value / peak
            base -= height
            css = f"s{j % SERIES}"
            stack.append(
                Segment(x - width / 2, base, width, height, name, css, value, version, shown(value))
            )
        bars.append(stack)
        if stack:
            tops.append((x, base, shown(totals[i])))
    names = [(name, f"s{j % SERIES}") for j, name in enumerate(parts)]
    ticks = [Tick(y1 - (y1 - y0) * f, _label(peak * f)) for f in (0.0, 0.5, 1.0)]
    return StackedBars(bars, tops, names, _x_ticks(versions, xs), ticks)


def _x_ticks(versions: Sequence[str], xs: Sequence[float]) -> list[Tick]:
    # Every version is named while they fit; past that, about twelve of them.
    step = max(1, math.ceil(len(versions) / 12))
    return [
        Tick(x, v[:10]) for i, (x, v) in enumerate(zip(xs, versions, strict=True)) if i % step == 0
    ]


def _decades(lo: int, hi: int) -> list[int]:
    step = max(1, math.ceil((hi - lo) / 5))
    return list(range(lo, hi + 1, step))


def _label(value: float) -> str:
    if value == int(value):
        return str(int(value))
    return f"{value:.2g}"
