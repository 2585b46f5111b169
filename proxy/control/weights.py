"""Weight updates without a failed call: the /v1/weights routes (they need the admin token).

    POST /v1/weights/begin   {"mode": "drain" | "abort_resume", "timeout": 600, "lease": 900}
    POST /v1/weights/commit  {"version": "13", "model_path": "/ckpt/13", "load_format": "auto"}
    POST /v1/weights/cancel  {}
    GET  /v1/weights

`begin` stops dispatching (new calls wait, as a pause does; none is refused). In `drain` mode it
answers once the calls in flight finished on the old weights (or `timeout` passed: then
`drained` is false and the trainer decides). In `abort_resume` mode the engines end their
running requests now; each such call is recorded with what it sampled and its version, then
continued on the new weights after the commit, and its client sees one uninterrupted answer.
`commit` optionally loads `model_path` into every backend (`update_weights_from_disk`, with the
new version as the engines' label), then empties the prefix caches that could still hold K/V of
the old weights (every SGLang backend; vLLM-dialect ones only with `serve --no-cache-salt`,
since their calls are otherwise salted per version: proxy/upstream/sampling.py), whether or not
`model_path` was given: a trainer that pushed the weights itself gets the same guarantee. Then
it reopens under `version`; if any backend fails to load or to flush, nothing reopens and the
answer lists each backend's result. `cancel` reopens on the old version.
With a `lease` (seconds), an update neither committed nor cancelled by then is cancelled, so a
trainer that dies mid-update does not hold every harness for ever.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from ..context import CONTEXT, ProxyContext
from ..errors import BadRequest, Conflict
from ..hold import UpdateInProgress, UpdateMode, WeightUpdate
from . import engine_control, replicated
from .admin import read_object, respond

log = logging.getLogger("rolltap.proxy")

MAX_VERSION_CHARS = 100
"""The store's weight_version column holds this many characters."""


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/weights", state)
    app.router.add_post("/v1/weights/begin", begin)
    app.router.add_post("/v1/weights/commit", commit)
    app.router.add_post("/v1/weights/cancel", cancel)


def weights_json(ctx: ProxyContext) -> dict[str, Any]:
    hold = ctx.hold
    update = hold.update
    return {
        "weight_version": hold.weight_version,
        "epoch": hold.epoch,
        "paused": hold.paused,
        "update": None if update is None else {"mode": update.mode.value},
        "inflight": hold.inflight,
        "waiting": hold.waiting,
        "history": [{"version": v, "epoch": e} for v, e in hold.history()],
    }


async def state(request: web.Request) -> web.Response:
    return respond(weights_json(request.app[CONTEXT]))


async def begin(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    body = await read_object(request)
    mode = _mode(body.get("mode", UpdateMode.DRAIN.value))
    timeout = _seconds(body.get("timeout", 600.0), "timeout")
    lease = body.get("lease")
    if lease is not None:
        lease = _seconds(lease, "lease")
    replicated.check_reach(ctx)
    try:
        update = ctx.hold.begin(mode)
    except UpdateInProgress as e:
        raise Conflict(str(e), code="update_in_progress") from None
    if lease is not None:
        asyncio.get_running_loop().call_later(lease, _expire, ctx, update)
    began = await replicated.begin(ctx, mode, timeout)
    return respond({**weights_json(ctx), **began})


async def commit(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    body = await read_object(request)
    version = body.get("version")
    if isinstance(version, int) and not isinstance(version, bool):
        version = str(version)
    if not isinstance(version, str) or not 0 < len(version) <= MAX_VERSION_CHARS:
        raise BadRequest(
            f"'version' must be a string of 1 to {MAX_VERSION_CHARS} characters", param="version"
        )
    if ctx.hold.update is None:
        raise Conflict(
            "no weight update is under way: POST /v1/weights/begin first", code="no_update"
        )
    loaded: list[dict[str, Any]] = []
    model_path = body.get("model_path")
    if model_path is not None:
        if not isinstance(model_path, str) or not model_path:
            raise BadRequest("'model_path' must be a path the engines can read", param="model_path")
        load_format = body.get("load_format", "auto")
        if not isinstance(load_format, str):
            raise BadRequest("'load_format' must be a string", param="load_format")
        order = {
            "model_path": model_path,
            "load_format": load_format,
            "weight_version": version,
            "abort_all_requests": ctx.hold.aborting,
            "flush_cache": True,
        }
        results = await engine_control.load_weights(ctx.client(), ctx.pool.all(), order)
        loaded = [r.as_dict() for r in results]
        if not all(r.ok for r in results):
            # Some engine may hold the new weights and some the old: nothing reopens.
            error = {
                "message": "not every backend loaded the weights; dispatching stays held",
                "type": "upstream_error",
                "param": "model_path",
                "code": "weight_load_failed",
            }
            return respond({"error": error, "backends": loaded}, status=502)
    flushed = await engine_control.flush_prefix_caches(
        ctx.client(), ctx.pool.all(), salted=ctx.settings.cache_salt
    )
    loaded += [r.as_dict() for r in flushed]
    if not all(r.ok for r in flushed):
        # Reopening now would let calls read K/V of the old weights.
        unflushed = {
            "message": "not every backend emptied its prefix cache; dispatching stays held",
            "type": "upstream_error",
            "param": None,
            "code": "cache_flush_failed",
        }
        return respond({"error": unflushed, "backends": loaded}, status=502)
    held = await replicated.commit(ctx, version)
    return respond({**weights_json(ctx), "held_seconds": held, "backends": loaded})


async def cancel(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    if ctx.hold.update is None:
        raise Conflict("no weight update is under way", code="no_update")
    held = await replicated.cancel(ctx)
    return respond({**weights_json(ctx), "held_seconds": held})


def _mode(value: object) -> UpdateMode:
    try:
        return UpdateMode(str(value))
    except ValueError:
        modes = ", ".join(m.value for m in UpdateMode)
        raise BadRequest(f"'mode' must be one of {modes}", param="mode") from None


def _expire(ctx: ProxyContext, update: WeightUpdate) -> None:
    """The trainer neither committed nor cancelled within its lease (it died, say): calls go
    on, on the weights they had, rather than wait for ever."""
    if ctx.hold.update is update:
        log.warning("weight update not committed within its lease: cancelled")
        replicated.spawn_cancel(ctx)


def _seconds(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise BadRequest(f"'{name}' must be a number of seconds", param=name)
    return float(value)
