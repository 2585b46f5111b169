"""The rollout service's HTTP API under /v1/batches (admin token, like the proxy's admin API).

    POST   /v1/batches                    submit (body: rolltap.runner.service.spec); 201 new,
                                          200 when the id or Idempotency-Key names a known batch
    GET    /v1/batches                    every batch this service holds
    GET    /v1/batches/{id}               counts by status, groups, pass@k so far
    GET    /v1/batches/{id}/groups        kept groups with their trajectories (?after=SEQ,
                                          ?limit=N, ?format=base64|arrow)
    GET    /v1/batches/{id}/events        SSE: `group` as each kept group completes, `dropped`,
                                          then `done`; Last-Event-ID (or ?after=) resumes
    DELETE /v1/batches/{id}               cancel: sandboxes killed, rollouts marked cancelled
    POST   /v1/batches/{id}/metrics       the trainer's figures about the batch (body:
                                          rolltap.runner.service.posted), stored; 201
    GET    /v1/batches/{id}/metrics       what trainers posted about it, oldest first

Errors have the proxy's OpenAI-style shape.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import orjson
from aiohttp import web

from ...proxy.errors import BadRequest, Conflict, NotFoundError
from ...wire import ENCODINGS
from .batch import Batch
from .events import Event, EventKind
from .groups import GroupRecord, group_message
from .posted import parse_posted
from .service import BatchConflict, Service, UnknownBatch
from .spec import SpecError

SERVICE = web.AppKey("rolltap_rollout_service", Service)


def mount(app: web.Application, service: Service) -> None:
    """Add the /v1/batches routes to `app` and stop the service's batches when it shuts down."""
    app[SERVICE] = service
    app.router.add_post("/v1/batches", submit)
    app.router.add_get("/v1/batches", list_batches)
    app.router.add_get("/v1/batches/{batch_id}", get_batch)
    app.router.add_delete("/v1/batches/{batch_id}", cancel_batch)
    app.router.add_get("/v1/batches/{batch_id}/groups", list_groups)
    app.router.add_get("/v1/batches/{batch_id}/events", events)
    app.router.add_post("/v1/batches/{batch_id}/metrics", post_metrics)
    app.router.add_get("/v1/batches/{batch_id}/metrics", list_metrics)

    async def stop(_: web.Application) -> None:
        await service.close()

    app.on_shutdown.append(stop)


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def _batch(request: web.Request) -> Batch:
    batch_id = request.match_info["batch_id"]
    try:
        return request.app[SERVICE].get(batch_id)
    except UnknownBatch:
        raise NotFoundError(f"no batch {batch_id!r} in this service") from None


def _encoding(request: web.Request) -> str:
    encoding = request.query.get("format", "base64")
    if encoding not in ENCODINGS:
        raise BadRequest(f"'format' must be one of {', '.join(ENCODINGS)}", param="format")
    return encoding


async def submit(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    raw = await request.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    key = request.headers.get("Idempotency-Key") or None
    try:
        batch, created = await service.submit(body, key)
    except SpecError as e:
        raise BadRequest(e.message, param=e.param) from None
    except BatchConflict as e:
        raise Conflict(str(e), code="batch_exists") from None
    headers = {"Location": f"/v1/batches/{batch.id}"}
    return _json(await service.status(batch), 201 if created else 200, headers)


async def list_batches(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return _json({"batches": [{"id": b.id, "status": b.status.value} for b in service.batches()]})


async def get_batch(request: web.Request) -> web.Response:
    return _json(await request.app[SERVICE].status(_batch(request)))


async def cancel_batch(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    batch = _batch(request)
    await service.cancel(batch.id)
    return _json(await service.status(batch))


async def list_groups(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    batch = _batch(request)
    encoding = _encoding(request)
    after = _int_query(request, "after", 0)
    limit = _int_query(request, "limit", 100)
    chosen = [g for g in batch.kept if g.seq > after][:limit]
    messages = [
        await group_message(service.store, batch.id, batch.spec, g, encoding, batch.recent)
        for g in chosen
    ]
    return _json({"groups": messages, "last_seq": chosen[-1].seq if chosen else after})


async def post_metrics(request: web.Request) -> web.Response:
    batch_id = request.match_info["batch_id"]
    raw = await request.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    try:
        posted = parse_posted(body)
    except SpecError as e:
        raise BadRequest(e.message, param=e.param, code="invalid_metrics") from None
    try:
        record = await request.app[SERVICE].record_metrics(
            batch_id, posted.policy_version, posted.metrics
        )
    except UnknownBatch:
        raise NotFoundError(f"no batch {batch_id!r} in this service or its store") from None
    return _json(record.as_dict(), 201)


async def list_metrics(request: web.Request) -> web.Response:
    batch_id = request.match_info["batch_id"]
    try:
        records = await request.app[SERVICE].metrics(batch_id)
    except UnknownBatch:
        raise NotFoundError(f"no batch {batch_id!r} in this service or its store") from None
    return _json({"metrics": [r.as_dict() for r in records]})


async def events(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE]
    batch = _batch(request)
    encoding = _encoding(request)
    after = _int_query(request, "after", 0)
    with contextlib.suppress(ValueError):
        after = max(after, int(request.headers.get("Last-Event-ID", "0")))
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    try:
        async for event in batch.events.follow(after):
            if event is None:
                await response.write(b": keep-alive\n\n")
                continue
            data = await _event_data(service, batch, event, encoding)
            await response.write(_frame(event, data))
        await response.write_eof()
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    return response


async def _event_data(service: Service, batch: Batch, event: Event, encoding: str) -> bytes:
    if event.kind is EventKind.GROUP:
        record: GroupRecord = event.data["record"]
        message = await group_message(
            service.store, batch.id, batch.spec, record, encoding, batch.recent
        )
        return orjson.dumps(message, option=orjson.OPT_SERIALIZE_NUMPY)
    return orjson.dumps(event.data)


def _frame(event: Event, data: bytes) -> bytes:
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (event.id, event.kind.value.encode(), data)


def _int_query(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"'{name}' must be an integer", param=name) from None
    if value < 0:
        raise BadRequest(f"'{name}' must not be negative", param=name)
    return value
