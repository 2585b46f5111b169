"""OpenTelemetry spans for rollouts, exported by OTLP/HTTP when configured (the `otel` extra:
`pip install 'rolltap[otel]'`), so a team that already traces its training jobs sees rollouts
in the same place.

Configured by OpenTelemetry's own variables in the environment of the process that runs the
rollouts (`rolltap run`, `rolltap serve --runner`, `python -m rolltap.runner.service`):
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the full URL, e.g. http://collector:4318/v1/traces) or
`OTEL_EXPORTER_OTLP_ENDPOINT` (its base), with the exporter's usual `OTEL_EXPORTER_OTLP_HEADERS`,
`..._TIMEOUT`, `..._COMPRESSION`; `OTEL_SERVICE_NAME` (default `rolltap`); `OTEL_SDK_DISABLED`.
An application embedding rolltap may call `configure(provider=...)` with its own provider.
Unconfigured, nothing of opentelemetry is imported.

One trace per rollout attempt, written when it ends:

    rollout            rolltap.rollout.id, .batch.id, .task.id, .sample, .attempt, .harness,
     |                 .status, .reward (an ERROR status unless it finished)
     +- provision      the sandbox made and the task set up (waiting for a slot included)
     +- harness        the harness's run, until its key was revoked and what it left was reaped
     |   +- chat MODEL one per model call the proxy recorded, from received to answered:
     |                 gen_ai.operation.name, gen_ai.request.model, gen_ai.usage.input_tokens,
     |                 gen_ai.usage.output_tokens, gen_ai.response.finish_reasons (GenAI
     |                 conventions), rolltap.call.id, .seq, .status, .backend, .weight_version,
     |                 .engine_seconds (dispatched to answered), .queued_seconds (received to
     |                 dispatched: held by a weight update), .first_token_seconds, .bridge
     +- verify         the task's tests

The model-call spans are made from the proxy's records of the calls (store), not in the proxy:
the proxy may be another process or several replicas, and its records hold each call's exact
times, so one place writes the whole tree with its parents right.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .store import CallStatus, CallView, RolloutStatus, RolloutView, Store, StoreError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

log = logging.getLogger("rolltap.telemetry")

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SCOPE = "rolltap"
PROVISION, HARNESS, VERIFY = "provision", "harness", "verify"


@dataclass
class RolloutTrace:
    """The wall-clock phases of one rollout attempt, gathered while it runs."""

    rollout_id: str
    started_ns: int = field(default_factory=time.time_ns)
    phases: list[tuple[str, int, int]] = field(default_factory=list)
    """(name, start, end) in ns since the epoch."""


@dataclass
class _Exporting:
    tracer: Tracer
    provider: TracerProvider
    owned: bool
    """Made here (flushed and shut down here), not the application's."""


_current: ContextVar[RolloutTrace | None] = ContextVar("rolltap_rollout_trace", default=None)
_lock = threading.Lock()
_state: _Exporting | None = None
_checked = False


def configure(endpoint: str | None = None, *, provider: TracerProvider | None = None) -> None:
    """Export rollout spans through `provider` (an application's own TracerProvider), else to
    the OTLP/HTTP traces URL `endpoint`, else as the OTEL_* variables say. Raises ImportError
    without the `otel` extra."""
    global _state, _checked
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    owned = provider is None
    if provider is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        name = os.environ.get("OTEL_SERVICE_NAME") or "rolltap"
        provider = TracerProvider(resource=Resource.create({SERVICE_NAME: name}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    with _lock:
        previous, _state, _checked = _state, None, True
        _state = _Exporting(provider.get_tracer(SCOPE), provider, owned)
    if previous is not None and previous.owned:
        previous.provider.shutdown()


def flush(timeout_seconds: float = 30.0) -> bool:
    """Export every span ended so far (blocks; False when it timed out)."""
    state = _state
    if state is None:
        return True
    return bool(state.provider.force_flush(int(timeout_seconds * 1000)))


def shutdown() -> None:
    """Flush and stop exporting; the environment is read again on the next rollout."""
    global _state, _checked
    with _lock:
        state, _state, _checked = _state, None, False
    if state is not None and state.owned:
        state.provider.shutdown()


def _exporting() -> _Exporting | None:
    global _checked
    with _lock:
        if _checked:
            return _state
        _checked = True
    wanted = any(os.environ.get(v) for v in ENDPOINT_VARIABLES)
    if not wanted or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    try:
        configure()
    except ImportError:
        log.warning(
            "%s is set, but opentelemetry is not installed: no rollout spans are exported "
            "(pip install 'rolltap[otel]')",
            next(v for v in ENDPOINT_VARIABLES if os.environ.get(v)),
        )
        return None
    return _state


def begin_rollout(rollout_id: str) -> RolloutTrace | None:
    """Start gathering a rollout attempt's phases (None, and nothing done, when no spans are
    exported). The phases then go to this task's trace (`phase_ended`)."""
    if _exporting() is None:
        return None
    trace = RolloutTrace(rollout_id)
    _current.set(trace)
    return trace


def phase_ended(name: str, seconds: float) -> None:
    """A phase of the current rollout attempt that took `seconds` ended now."""
    trace = _current.get()
    if trace is not None:
        end = time.time_ns()
        trace.phases.append((name, end - int(seconds * 1e9), end))


async def end_rollout(trace: RolloutTrace | None, store: Store) -> None:
    """Write the attempt's spans, its calls' read from the store (they are durable by now)."""
    if trace is None:
        return
    _current.set(None)
    state = _state
    if state is None:
        return
    try:
        view = await store.rollout(trace.rollout_id)
        calls = await store.calls(trace.rollout_id)
    except StoreError as e:
        log.warning("rollout %s: no spans, its record cannot be read: %s", trace.rollout_id, e)
        return
    _write(state.tracer, trace, view, calls)


def _write(tracer: Tracer, trace: RolloutTrace, view: RolloutView, calls: list[CallView]) -> None:
    from opentelemetry import trace as api
    from opentelemetry.trace import SpanKind, Status, StatusCode

    rollout = tracer.start_span("rollout", start_time=trace.started_ns, attributes=_of(view))
    if view.status is not RolloutStatus.FINISHED:
        rollout.set_status(Status(StatusCode.ERROR, view.error or view.status.value))
    inside = api.set_span_in_context(rollout)
    calls_context = inside
    for name, start, end in trace.phases:
        phase = tracer.start_span(name, context=inside, start_time=start)
        if name == HARNESS:
            calls_context = api.set_span_in_context(phase)
        phase.end(end_time=end)
    for call in calls:
        operation = "text_completion" if call.dialect.value == "completions" else "chat"
        span = tracer.start_span(
            f"{operation} {call.model or ''}".strip(),
            context=calls_context,
            kind=SpanKind.CLIENT,
            start_time=_ns(call.received_at),
            attributes=_call(call, operation),
        )
        if call.status is not CallStatus.OK:
            span.set_status(Status(StatusCode.ERROR, call.error or call.status.value))
        span.end(end_time=_ns(call.finished_at or call.first_token_at or call.received_at))
    rollout.end(end_time=time.time_ns())


def _of(view: RolloutView) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "rolltap.rollout.id": view.id,
        "rolltap.rollout.status": view.status.value,
        "rolltap.attempt": view.attempt,
        "rolltap.calls": view.n_calls,
        "rolltap.tokens": view.n_tokens,
    }
    optional = {
        "rolltap.batch.id": view.batch_id,
        "rolltap.task.id": view.task_id,
        "rolltap.sample": view.sample_index,
        "rolltap.harness": view.harness,
        "rolltap.reward": view.reward,
        "rolltap.policy_version": view.meta.get("policy_version"),
        "gen_ai.request.model": view.model,
    }
    return attributes | {k: v for k, v in optional.items() if v is not None}


def _call(call: CallView, operation: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "gen_ai.usage.input_tokens": call.prompt_tokens,
        "gen_ai.usage.output_tokens": call.completion_tokens,
        "rolltap.call.id": call.id,
        "rolltap.call.seq": call.seq,
        "rolltap.call.status": call.status.value,
        "rolltap.call.dialect": call.dialect.value,
        "rolltap.call.stream": call.stream,
    }
    optional = {
        "gen_ai.request.model": call.model,
        "gen_ai.response.finish_reasons": [call.finish_reason] if call.finish_reason else None,
        "rolltap.call.backend": call.backend,
        "rolltap.call.weight_version": call.weight_version,
        "rolltap.call.purpose": call.purpose,
        "rolltap.call.bridge": call.bridge,
        "rolltap.call.engine_seconds": _seconds(call.dispatched_at, call.finished_at),
        "rolltap.call.queued_seconds": _seconds(call.received_at, call.dispatched_at),
        "rolltap.call.first_token_seconds": _seconds(call.dispatched_at, call.first_token_at),
    }
    return attributes | {k: v for k, v in optional.items() if v is not None}


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else (end - start).total_seconds()


def _ns(t: datetime) -> int:
    return int(t.timestamp()) * 1_000_000_000 + t.microsecond * 1000
