"""Rollout spans over OTLP (telemetry.py): a real batch through the rollout service, its
harness making two model calls per rollout to the fake engine, exported to an in-process OTLP/HTTP
collector that decodes what it receives with opentelemetry-proto; and no opentelemetry import at
all when nothing asks for spans."""

from __future__ import annotations

import asyncio
import gzip
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from rolltap import telemetry
from rolltap.store import Store
from tests.support.fake_vllm import FakeVLLM, Reply
from tests.support.proxy import fake_engine
from tests.support.service import running_service
from tests.support.training_run import TWO_CALLS

pytest.importorskip("opentelemetry.sdk", reason="the otel extra: pip install -e '.[otel]'")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

TASKS = [
    {"id": f"t{i}", "instruction": f"task {i}", "test": "grep -q yes answer.txt"} for i in range(2)
]


class Collector:
    """An OTLP/HTTP trace receiver: POST /v1/traces with a protobuf ExportTraceServiceRequest."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.services: set[str] = set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/traces", self.receive)
        return app

    async def receive(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest.FromString(body)
        for resource_spans in export.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            self.services.add(resource["service.name"])
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        {
                            "name": span.name,
                            "trace": span.trace_id.hex(),
                            "id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex() or None,
                            "start": span.start_time_unix_nano,
                            "end": span.end_time_unix_nano,
                            "error": span.status.code == span.status.STATUS_CODE_ERROR,
                            "attributes": _attributes(span.attributes),
                        }
                    )
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )


def _attributes(pairs: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for pair in pairs:
        kind = pair.value.WhichOneof("value")
        value = getattr(pair.value, kind)
        if kind == "array_value":
            value = [getattr(v, v.WhichOneof("value")) for v in value.values]
        found[pair.key] = value
    return found


@pytest.fixture
async def collector(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Collector]:
    """The collector, named by the standard variable as a user would (read on the next
    rollout: telemetry.shutdown() forgets what an earlier test configured)."""
    receiver = Collector()
    server = TestServer(receiver.app())
    await server.start_server()
    for name in telemetry.ENDPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", str(server.make_url("")).rstrip("/"))
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    telemetry.shutdown()
    try:
        yield receiver
    finally:
        await asyncio.to_thread(telemetry.shutdown)
        await server.close()


@pytest.fixture
def no_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


async def test_each_rollout_is_a_trace_of_its_phases_and_model_calls(
    collector: Collector, store: Store, tmp_path: Path
) -> None:
    def answer(body: dict[str, Any]) -> Reply:
        return Reply(text="yes" if len(body["messages"]) > 1 else "ok")

    async with (
        fake_engine(FakeVLLM(script=answer)) as engine,
        running_service(
            store,
            engine.url,
            logs=tmp_path / "logs",
            scripts={"two-calls": TWO_CALLS},
            weight_version="7",
        ) as service,
    ):
        batch = await service.client.submit(
            TASKS, harness="two-calls", samples_per_task=2, policy_version="7"
        )
        [e async for e in service.client.events(batch.id)]
        assert await asyncio.to_thread(telemetry.flush)

    assert collector.services == {"rolltap"}
    traces: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for span in collector.spans:
        traces[span["trace"]].append(span)
    views = await store.rollouts(batch=batch.id)
    assert len(views) == 4
    assert len(traces) == 4  # one trace per rollout
    by_rollout = {
        next(s for s in spans if s["name"] == "rollout")["attributes"]["rolltap.rollout.id"]: spans
        for spans in traces.values()
    }
    assert set(by_rollout) == {v.id for v in views}
    for view in views:
        spans = {s["name"]: s for s in by_rollout[view.id] if not s["name"].startswith("chat")}
        calls = sorted(
            (s for s in by_rollout[view.id] if s["name"] == "chat fake-model"),
            key=lambda s: s["attributes"]["rolltap.call.seq"],
        )
        root = spans["rollout"]
        assert root["parent"] is None
        assert not root["error"]
        assert (
            root["attributes"]
            | {
                "rolltap.batch.id": batch.id,
                "rolltap.task.id": view.task_id,
                "rolltap.sample": view.sample_index,
                "rolltap.rollout.status": "finished",
                "rolltap.reward": 1.0,
                "rolltap.policy_version": "7",
                "rolltap.harness": "two-calls",
            }
            == root["attributes"]
        )
        for phase in ("provision", "harness", "verify"):
            assert spans[phase]["parent"] == root["id"], phase
        provision, harness, verify = spans["provision"], spans["harness"], spans["verify"]
        assert root["start"] <= provision["start"] < provision["end"] <= harness["start"]
        assert harness["end"] <= verify["start"] < verify["end"] <= root["end"]

        # Every model call, under the harness, as the proxy recorded it.
        recorded = sorted(await store.calls(view.id), key=lambda c: c.seq)
        assert len(calls) == len(recorded) == 2
        for span, call in zip(calls, recorded, strict=True):
            attributes = span["attributes"]
            assert span["parent"] == harness["id"]
            assert harness["start"] <= span["start"] <= span["end"] <= harness["end"]
            assert attributes["rolltap.call.id"] == call.id
            assert attributes["gen_ai.operation.name"] == "chat"
            assert attributes["gen_ai.request.model"] == "fake-model"
            assert attributes["gen_ai.usage.input_tokens"] == call.prompt_tokens > 0
            assert attributes["gen_ai.usage.output_tokens"] == call.completion_tokens > 0
            assert attributes["gen_ai.response.finish_reasons"] == ["stop"]
            assert attributes["rolltap.call.weight_version"] == "7"
            assert attributes["rolltap.call.status"] == "ok"
            assert call.dispatched_at is not None
            assert call.finished_at is not None
            engine_seconds = (call.finished_at - call.dispatched_at).total_seconds()
            assert attributes["rolltap.call.engine_seconds"] == pytest.approx(engine_seconds)
            assert 0 < engine_seconds <= (span["end"] - span["start"]) / 1e9 + 1e-6


def test_nothing_of_opentelemetry_is_imported_unless_configured(no_otel_variables: None) -> None:
    code = (
        "import sys\n"
        "from rolltap import telemetry\n"
        "import rolltap.runner.rollout\n"
        "assert telemetry.begin_rollout('r') is None\n"
        "telemetry.phase_ended('harness', 1.0)\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
