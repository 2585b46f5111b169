"""/metrics: Prometheus exposition by prometheus_client, escaped, behind the admin token."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from rolltap.proxy.metrics import Gauge, ProxyMetrics
from rolltap.store import Store
from tests.support.proxy import fake_engine, running_proxy


def test_label_values_are_escaped_and_parse_back() -> None:
    metrics = ProxyMetrics()
    hostile = 'http://x/"} 1\nrolltap_paused 1 \\'
    metrics.gauges.append(
        Gauge("rolltap_backend_healthy", "h", lambda: [((("backend", hostile),), 1)])
    )
    metrics.errors.inc(kind=hostile)

    text = metrics.render().decode()

    families = {f.name: f for f in text_string_to_metric_families(text)}
    (gauge,) = families["rolltap_backend_healthy"].samples
    assert gauge.labels == {"backend": hostile}
    errors = [s for s in families["rolltap_errors"].samples if s.name == "rolltap_errors_total"]
    assert [(s.labels, s.value) for s in errors] == [({"kind": hostile}, 1.0)]
    # The label value could not start a line of its own.
    assert not any(line.startswith("rolltap_paused 1") for line in text.splitlines())


def test_every_metric_keeps_its_name() -> None:
    metrics = ProxyMetrics()
    metrics.calls.inc(dialect="chat", status="ok")
    metrics.tokens.inc(5, kind="prompt")
    metrics.latency.observe(0.2, dialect="chat")
    metrics.overhead.observe(0.001, dialect="chat")
    metrics.ttft.observe(0.05)

    text = metrics.render().decode()

    for line in (
        'rolltap_calls_total{dialect="chat",status="ok"} 1.0',
        'rolltap_tokens_total{kind="prompt"} 5.0',
        'rolltap_call_seconds_bucket{dialect="chat",le="0.25"} 1.0',
        'rolltap_proxy_overhead_seconds_count{dialect="chat"} 1.0',
        "rolltap_time_to_first_token_seconds_sum 0.05",
    ):
        assert line in text.splitlines()
    assert metrics.tokens.value(kind="prompt") == 5.0


async def test_metrics_need_the_admin_token_when_there_is_one(store: Store) -> None:
    async with (
        fake_engine() as engine,
        running_proxy(store, engine.url, admin_token="s3cret-admin") as proxy,
        aiohttp.ClientSession() as session,
    ):
        async with session.get(f"{proxy.url}/metrics") as resp:
            assert resp.status == 401
            assert "s3cret" not in await resp.text()
        headers = {"Authorization": "Bearer s3cret-admin"}
        async with session.get(f"{proxy.url}/metrics", headers=headers) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            assert "rolltap_backend_healthy" in await resp.text()
