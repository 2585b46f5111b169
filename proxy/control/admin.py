"""The admin API: rollouts, backends, pause/resume around weight updates, status.

Protected by `Authorization: Bearer <admin token>` when the proxy has one (ROLLTAP_ADMIN_TOKEN),
as is /metrics, and so are the trainer-facing routes under /v1/weights (proxy/control/weights.py)
and /v1/batches (the rollout service, rolltap.runner.service). A proxy listening beyond
loopback must have one (`check_exposure`).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
from dataclasses import asdict
from datetime import datetime
from typing import Any

import orjson
from aiohttp import web

from ...analysis import outcomes
from ...analysis.reading import analyze_rollout, rollout_trajectories
from ...audit.replay import replay_report
from ...export.export import rollout_dict
from ...store import IllegalTransition, NewRollout, NotFound, RolloutStatus, RolloutView
from ...store.events import Declared
from ...store.store import FINAL_STATUSES
from ..context import CONTEXT, ProxyContext
from ..errors import BadRequest, Conflict, NotFoundError, ProxyError, Unauthorized
from ..upstream import routed
from ..upstream.backends import parse_backend
from . import replicated

_NEW_ROLLOUT_FIELDS = {
    "batch_id": str,
    "task_id": str,
    "sample_index": int,
    "attempt": int,
    "harness": str,
    "model": str,
    "max_calls": int,
    "max_tokens": int,
    "meta": dict,
}
_UPDATE_FIELDS = {"status", "reward", "reward_details", "error", "meta"}
_STATUSES = [s.value for s in RolloutStatus]
ADMIN_PATHS = ("/admin", "/v1/weights", "/v1/batches")
"""Path prefixes that need the admin token; the rest of /v1 takes rollout keys."""


def respond(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=orjson.dumps(data, default=_default), status=status, content_type="application/json"
    )


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(type(value).__name__)


class ExposedWithoutToken(ValueError):
    """A server (the proxy, the viewer) would listen beyond this machine without a token."""


def check_exposure(host: str, admin_token: str | None) -> None:
    """Refuse a non-loopback listening address without an admin token.

    Refused rather than given a generated token: a token printed once ends up in logs and
    terminal scrollback, and whoever needs it (a trainer, a runner) has to be told it anyway.
    """
    if admin_token or is_loopback(host):
        return
    raise ExposedWithoutToken(
        f"refusing to listen on {host or 'every address'} without an admin token (anyone who "
        "reaches it could create rollouts, add backends, pause the proxy): set "
        "--admin-token or ROLLTAP_ADMIN_TOKEN, e.g. export ROLLTAP_ADMIN_TOKEN=$(openssl rand "
        "-hex 32)"
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name may resolve to anything: treat it as exposed


def _authorize(request: web.Request, ctx: ProxyContext) -> None:
    token = ctx.settings.admin_token
    if not token:
        return
    given = request.headers.get("Authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        raise Unauthorized("admin API needs the admin token", code="invalid_admin_token")


async def read_object(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw:
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def rollout_json(view: RolloutView) -> dict[str, Any]:
    data = asdict(view)
    data["status"] = view.status.value
    return data


def base_url(request: web.Request, key: str) -> str:
    return f"{request.scheme}://{request.host}/r/{key}/v1"


@web.middleware
async def admin_auth(request: web.Request, handler: Any) -> web.StreamResponse:
    if request.path == "/metrics":
        # Backend URLs and call volumes are the operator's business, not a sandbox's.
        _authorize(request, request.app[CONTEXT])
    if not request.path.startswith(ADMIN_PATHS):
        response: web.StreamResponse = await handler(request)
        return response
    _authorize(request, request.app[CONTEXT])
    # An admin change is finished even if its client hangs up (handlers are cancelled then).
    return await asyncio.shield(handler(request))


async def create_rollout(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    body = await read_object(request)
    fields: dict[str, Any] = {}
    token_in = body.pop("token_in", None)
    if token_in is not None and not isinstance(token_in, bool):
        raise BadRequest("'token_in' must be a boolean", param="token_in")
    routed_experts = body.pop("routed_experts", None)
    if routed_experts is not None and not isinstance(routed_experts, bool):
        raise BadRequest("'routed_experts' must be a boolean", param="routed_experts")
    if routed_experts:
        reason = routed.refusal((b.kind for b in ctx.pool.all()), ctx.settings.builtin_engine)
        if reason is not None:
            raise BadRequest(reason, param="routed_experts")
    for key, value in body.items():
        expected = _NEW_ROLLOUT_FIELDS.get(key)
        if expected is None:
            raise BadRequest(f"unknown field {key!r}", param=key)
        if value is not None and (not isinstance(value, expected) or isinstance(value, bool)):
            raise BadRequest(f"{key!r} must be {expected.__name__}", param=key)
        fields[key] = value
    if token_in is not None:
        # Kept with the rollout, so any proxy serving it (or this one after a restart) knows.
        fields["meta"] = {**(fields.get("meta") or {}), "token_in": token_in}
    if routed_experts is not None:
        fields["meta"] = {**(fields.get("meta") or {}), "routed_experts": routed_experts}
    try:
        created = await ctx.store.create_rollout(NewRollout(**fields))
    except Exception as e:
        if "unique" in str(e).lower():
            raise BadRequest("a rollout with this batch, task and sample already exists") from None
        raise
    return respond(
        {"id": created.id, "key": created.key, "base_url": base_url(request, created.key)}, 201
    )


async def get_rollout(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    rollout_id = request.match_info["rollout_id"]
    try:
        view = await ctx.store.rollout(rollout_id)
    except NotFound:
        raise NotFoundError(f"no rollout {rollout_id!r}") from None
    data = rollout_json(view)
    data["backend"] = ctx.router.assigned(rollout_id)
    return respond(data)


async def update_rollout(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    rollout_id = request.match_info["rollout_id"]
    body = await read_object(request)
    unknown = set(body) - _UPDATE_FIELDS
    if unknown:
        raise BadRequest(f"cannot update {sorted(unknown)}")
    if "status" in body and body["status"] not in (*_STATUSES, "succeeded"):
        # "succeeded" is FINISHED's old name: clients written before the rename still work.
        raise BadRequest(f"status {body['status']!r} is not one of {', '.join(_STATUSES)}")
    try:
        if "status" in body:
            declared = Declared(RolloutStatus(body.pop("status")))
            view = await ctx.store.report(rollout_id, declared, **body)
        else:
            view = await ctx.store.update_rollout(rollout_id, **body)
    except NotFound:
        raise NotFoundError(f"no rollout {rollout_id!r}") from None
    except IllegalTransition as e:
        raise Conflict(str(e), code="illegal_transition") from None
    except ValueError as e:
        raise BadRequest(str(e)) from None
    if view.status in FINAL_STATUSES:
        # A finished rollout gets its segments, drift breaks and faithfulness recorded.
        await analyze_rollout(ctx.store, rollout_id)
        ctx.store.forget(rollout_id)
    return respond(rollout_json(view))


async def get_trajectory(request: web.Request) -> web.Response:
    """The rollout's token-faithful trajectories (segments, masks, logprobs, drift) as JSON."""
    ctx = request.app[CONTEXT]
    rollout_id = request.match_info["rollout_id"]
    try:
        # Assembled on the store's read thread, serialized on a worker thread: a big
        # rollout takes seconds of CPU that must not stall the calls on this loop.
        built = await rollout_trajectories(ctx.store, rollout_id)
    except NotFound:
        raise NotFoundError(f"no rollout {rollout_id!r}") from None
    bridging = await outcomes.bridging(ctx.store, rollout_id=rollout_id)
    parsing = await outcomes.tool_parsing(ctx.store, rollout_id=rollout_id)

    def serialize() -> bytes:
        # rollout_dict turns every token array into a list: as much CPU as the dump itself.
        document = rollout_dict(built)
        document["bridging"] = None if bridging is None else bridging.as_dict()
        document["tool_parsing"] = None if parsing is None else parsing.as_dict()
        return orjson.dumps(document, default=_default)

    body = await asyncio.to_thread(serialize)
    return web.Response(body=body, content_type="application/json")


async def get_replay(request: web.Request) -> web.Response:
    """A replay rollout's report, or an original's latest replay's (audit/replay.py)."""
    ctx = request.app[CONTEXT]
    rollout_id = request.match_info["rollout_id"]
    try:
        report = await replay_report(ctx.store, rollout_id)
    except NotFound:
        raise NotFoundError(f"no rollout {rollout_id!r}") from None
    if report is None:
        raise NotFoundError(f"rollout {rollout_id!r} has no replay report", code="no_replay")
    return respond(report.to_json())


async def list_backends(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    return respond({"backends": [_backend_json(b) for b in ctx.pool.all()]})


def _backend_json(backend: Any) -> dict[str, Any]:
    return {
        "url": backend.url,
        "kind": backend.kind.value,
        "healthy": backend.healthy,
        "inflight": backend.inflight,
        "served": backend.served,
    }


async def add_backend(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    body = await read_object(request)
    spec = body.get("url")
    if not isinstance(spec, str):
        raise BadRequest("'url' must be a string", param="url")
    if isinstance(body.get("kind"), str):
        spec = f"{body['kind']}={spec}"
    try:
        url, kind = parse_backend(spec)
    except ValueError as e:
        raise BadRequest(str(e), param="url") from None
    replicated.check_reach(ctx)
    backend = ctx.pool.add(url, kind)
    await ctx.pool.check_all(ctx.client(), timeout=2.0)
    await replicated.add_backend(ctx, f"{kind.value}={url}")
    ctx.names.learn(await ctx.pool.served_models(ctx.client()))
    return respond(_backend_json(backend), 201)


async def remove_backend(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    url = request.query.get("url") or (await read_object(request)).get("url")
    if not isinstance(url, str):
        raise BadRequest("give the backend's url", param="url")
    replicated.check_reach(ctx)
    removed = ctx.pool.remove(url.rstrip("/").removesuffix("/v1"))
    if removed is None:
        raise NotFoundError(f"no backend {url!r}")
    await replicated.remove_backend(ctx, removed.url)
    return respond(_backend_json(removed))


async def pause(request: web.Request) -> web.Response:
    """Hold new calls (on every replica); with ?wait=SECONDS, answer once in-flight calls
    finished."""
    ctx = request.app[CONTEXT]
    wait = request.query.get("wait")
    try:
        seconds = float(wait) if wait else None
    except ValueError:
        raise BadRequest("'wait' must be a number of seconds", param="wait") from None
    return respond(await replicated.pause(ctx, seconds))


async def resume(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    body = await read_object(request)
    version = body.get("weight_version")
    if version is not None and not isinstance(version, str | int):
        raise BadRequest("'weight_version' must be a string", param="weight_version")
    await replicated.resume(ctx, None if version is None else str(version))
    return respond({"paused": False, "weight_version": ctx.hold.weight_version})


async def status(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    return respond(
        {
            "paused": ctx.hold.paused,
            "inflight": ctx.hold.inflight,
            "waiting": ctx.hold.waiting,
            "weight_version": ctx.hold.weight_version,
            "weight_epoch": ctx.hold.epoch,
            "backends": [_backend_json(b) for b in ctx.pool.all()],
        }
    )


def add_routes(app: web.Application) -> None:
    app.router.add_post("/admin/rollouts", create_rollout)
    app.router.add_get("/admin/rollouts/{rollout_id}", get_rollout)
    app.router.add_patch("/admin/rollouts/{rollout_id}", update_rollout)
    app.router.add_get("/admin/rollouts/{rollout_id}/trajectory", get_trajectory)
    app.router.add_get("/admin/rollouts/{rollout_id}/replay", get_replay)
    app.router.add_get("/admin/backends", list_backends)
    app.router.add_post("/admin/backends", add_backend)
    app.router.add_delete("/admin/backends", remove_backend)
    app.router.add_post("/admin/pause", pause)
    app.router.add_post("/admin/resume", resume)
    app.router.add_get("/admin/status", status)


__all__ = [
    "ADMIN_PATHS",
    "ExposedWithoutToken",
    "ProxyError",
    "add_routes",
    "admin_auth",
    "check_exposure",
    "is_loopback",
    "read_object",
    "respond",
]
