"""Prometheus text exposition of the proxy's counters, histograms and gauges."""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable

Labels = tuple[tuple[str, str], ...]

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)


def _render_labels(labels: Labels, extra: str = "") -> str:
    parts = [f'{k}="{v}"' for k, v in labels]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class Counter:
    def __init__(self, name: str, help_: str) -> None:
        self.name, self.help = name, help_
        self._values: dict[Labels, float] = defaultdict(float)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self._values[tuple(sorted(labels.items()))] += amount

    def value(self, **labels: str) -> float:
        return self._values.get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} counter"
        for labels, value in self._values.items():
            yield f"{self.name}{_render_labels(labels)} {value}"


class Histogram:
    def __init__(self, name: str, help_: str, buckets: tuple[float, ...]) -> None:
        self.name, self.help, self.buckets = name, help_, buckets
        self._counts: dict[Labels, list[int]] = {}
        self._sums: dict[Labels, float] = defaultdict(float)

    def observe(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = [0] * (len(self.buckets) + 1)
        counts[bisect.bisect_left(self.buckets, value)] += 1
        self._sums[key] += value

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        for labels, counts in self._counts.items():
            running = 0
            for bound, count in zip(self.buckets, counts, strict=False):
                running += count
                le = _render_labels(labels, f'le="{bound}"')
                yield f"{self.name}_bucket{le} {running}"
            running += counts[-1]
            le = _render_labels(labels, 'le="+Inf"')
            yield f"{self.name}_bucket{le} {running}"
            yield f"{self.name}_sum{_render_labels(labels)} {self._sums[labels]}"
            yield f"{self.name}_count{_render_labels(labels)} {running}"


class Gauge:
    """A gauge read when scraped, so it never goes stale."""

    def __init__(
        self, name: str, help_: str, read: Callable[[], Iterable[tuple[Labels, float]]]
    ) -> None:
        self.name, self.help, self._read = name, help_, read

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} gauge"
        for labels, value in self._read():
            yield f"{self.name}{_render_labels(labels)} {value}"


class ProxyMetrics:
    def __init__(self) -> None:
        self.calls = Counter("rolltap_calls_total", "Calls received, by dialect and outcome.")
        self.errors = Counter("rolltap_errors_total", "Calls answered with an error, by kind.")
        self.tokens = Counter(
            "rolltap_tokens_total", "Tokens recorded, by kind (prompt/completion)."
        )
        self.latency = Histogram(
            "rolltap_call_seconds", "Time from request to last byte.", LATENCY_BUCKETS
        )
        self.overhead = Histogram(
            "rolltap_proxy_overhead_seconds",
            "Time spent in the proxy itself: before dispatch and after the engine finished.",
            OVERHEAD_BUCKETS,
        )
        self.ttft = Histogram(
            "rolltap_time_to_first_token_seconds",
            "Streaming: time to first chunk.",
            LATENCY_BUCKETS,
        )
        self.gauges: list[Gauge] = []

    def render(self) -> str:
        lines: list[str] = []
        for metric in (
            self.calls,
            self.errors,
            self.tokens,
            self.latency,
            self.overhead,
            self.ttft,
        ):
            lines.extend(metric.render())
        for gauge in self.gauges:
            lines.extend(gauge.render())
        return "\n".join(lines) + "\n"
