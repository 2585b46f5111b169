"""The proxy's counters, histograms and gauges, exposed by prometheus_client.

Each proxy has its own registry (no process-wide state: several proxies may share a process, as
tests do). Label values are escaped by the library's exposition code. On the hot path a labelled
series is looked up once and cached, so counting a call costs a dict lookup and a locked add.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import prometheus_client
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from ..analysis.bridging import break_rate
from ..analysis.toolparse import MALFORMED, OK

Labels = tuple[tuple[str, str], ...]

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST


class _Labelled:
    """A metric's labelled series, created on first use and cached by label values."""

    def __init__(self, metric: Any, labels: tuple[str, ...]) -> None:
        self._metric = metric
        self._labels = labels
        self._series: dict[tuple[str, ...], Any] = {}

    def series(self, labels: dict[str, str]) -> Any:
        if not self._labels:
            return self._metric
        key = tuple(labels[name] for name in self._labels)
        found = self._series.get(key)
        if found is None:
            found = self._series[key] = self._metric.labels(*key)
        return found


class Counter:
    def __init__(
        self, registry: CollectorRegistry, name: str, help_: str, labels: tuple[str, ...]
    ) -> None:
        self.name = name
        self._registry = registry
        metric = prometheus_client.Counter(name, help_, labels, registry=registry)
        self._metric = metric
        self._labelled = _Labelled(metric, labels)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        self._labelled.series(labels).inc(amount)

    def value(self, **labels: str) -> float:
        return self._registry.get_sample_value(self.name, labels) or 0.0

    def collect(self) -> list[Metric]:
        return list(self._metric.collect())

    def total(self) -> float:
        """Summed over every label value."""
        return sum(s.value for m in self.collect() for s in m.samples if s.name == self.name)


class Histogram:
    def __init__(
        self,
        registry: CollectorRegistry,
        name: str,
        help_: str,
        buckets: tuple[float, ...],
        labels: tuple[str, ...] = (),
    ) -> None:
        metric = prometheus_client.Histogram(
            name, help_, labels, registry=registry, buckets=buckets
        )
        self._labelled = _Labelled(metric, labels)

    def observe(self, value: float, **labels: str) -> None:
        self._labelled.series(labels).observe(value)


class Gauge:
    """A gauge read when scraped, so it never goes stale."""

    def __init__(
        self, name: str, help_: str, read: Callable[[], Iterable[tuple[Labels, float]]]
    ) -> None:
        self.name, self.help, self._read = name, help_, read

    def family(self) -> GaugeMetricFamily:
        samples = list(self._read())
        names = [k for k, _ in samples[0][0]] if samples else []
        family = GaugeMetricFamily(self.name, self.help, labels=names)
        for labels, value in samples:
            family.add_metric([v for _, v in labels], value)
        return family


class _Gauges(Collector):
    def __init__(self, gauges: list[Gauge]) -> None:
        self._gauges = gauges

    def collect(self) -> Iterator[Metric]:
        for gauge in self._gauges:
            yield gauge.family()


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.calls = Counter(
            r,
            "rolltap_calls_total",
            "Calls received, by dialect and outcome.",
            ("dialect", "status"),
        )
        self.errors = Counter(
            r, "rolltap_errors_total", "Calls answered with an error, by kind.", ("kind",)
        )
        self.tokens = Counter(
            r, "rolltap_tokens_total", "Tokens recorded, by kind (prompt/completion).", ("kind",)
        )
        self.latency = Histogram(
            r,
            "rolltap_call_seconds",
            "Time from request to last byte.",
            LATENCY_BUCKETS,
            ("dialect",),
        )
        self.overhead = Histogram(
            r,
            "rolltap_proxy_overhead_seconds",
            "Time spent in the proxy itself: before dispatch and after the engine finished.",
            OVERHEAD_BUCKETS,
            ("dialect",),
        )
        self.ttft = Histogram(
            r,
            "rolltap_time_to_first_token_seconds",
            "Streaming: time to first chunk.",
            LATENCY_BUCKETS,
        )
        self.token_in = Counter(
            r,
            "rolltap_token_in_calls_total",
            "Calls of token-in rollouts: outcome `bridged`, or the reason code of a fallback.",
            ("outcome",),
        )
        self.hacked = Counter(
            r,
            "rolltap_hack_flagged_rollouts_total",
            "Finished rollouts the reward-hack detectors flagged, by detector (analysis/hacks.py).",
            ("detector",),
        )
        self.bridge_seconds = Histogram(
            r,
            "rolltap_bridge_seconds",
            "Token-in: time to find a call's lineage and render its bridge.",
            OVERHEAD_BUCKETS,
        )
        self.tool_parse = Counter(
            r,
            "rolltap_tool_parse_total",
            "Answers whose tool calls rolltap (token-in) or its built-in engine parsed, by "
            "outcome: ok, malformed (the text went to the client as content), none (no call).",
            ("outcome",),
        )
        self.gauges: list[Gauge] = []
        self.gauges.append(
            Gauge(
                "rolltap_bridge_break_rate",
                "Token-in: fallbacks that broke a conversation's token chain, over calls that "
                "continue a conversation (all but first turns).",
                lambda: [((), self.bridge_break_rate())],
            )
        )
        self.gauges.append(
            Gauge(
                "rolltap_malformed_call_rate",
                "Answers whose tool calls did not parse, over answers that wrote calls (those "
                "rolltap or its built-in engine parsed).",
                lambda: [((), self.malformed_call_rate())],
            )
        )
        r.register(_Gauges(self.gauges))

    def bridge_break_rate(self) -> float:
        outcomes = {
            sample.labels["outcome"]: sample.value
            for metric in self.token_in.collect()
            for sample in metric.samples
            if sample.name.endswith("_total")
        }
        return break_rate(outcomes) or 0.0

    def malformed_call_rate(self) -> float:
        counts = {
            sample.labels["outcome"]: sample.value
            for metric in self.tool_parse.collect()
            for sample in metric.samples
            if sample.name.endswith("_total")
        }
        wrote = counts.get(OK, 0.0) + counts.get(MALFORMED, 0.0)
        return counts.get(MALFORMED, 0.0) / wrote if wrote else 0.0

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return prometheus_client.generate_latest(self.registry)
