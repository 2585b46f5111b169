"""Weight updates without a failed call: the /v1/weights routes (they need the admin token).

    POST /v1/weights/begin   {"mode": "drain" | "abort_resume" | "in_place", "timeout": 600,
                              "lease": 900}
    POST /v1/weights/commit  {"version": "13", "model_path": "/ckpt/13", "load_format": "auto"}
                             {"version": "13", "update_info": {...}}   (the engine's transfer)
                             {"version": "13"}                         (the trainer pushed)
    POST /v1/weights/cancel  {}
    GET  /v1/weights

`begin` stops dispatching (new calls wait, as a pause does; none is refused) and pauses every
engine through its own control plane, in the mode's way (proxy/control/engine_control.py). In
`drain` mode it answers once the calls in flight finished on the old weights (or `timeout`
passed: then `drained` is false and the trainer decides). In `abort_resume` mode the engines
end their running requests now; each such call is recorded with what it sampled and its
version, then continued on the new weights after the commit, and its client sees one
uninterrupted answer. In `in_place` mode the running requests freeze in their engines and go
on after the commit on the new weights, with no re-prefill; each answer records which of its
tokens each version sampled (its weight spans); an engine that cannot freeze them fails the
begin, naming it, and nothing stays held.

`commit` gives every engine the new weights under `version`: `model_path` is loaded
(`update_weights_from_disk`, with the version as the engine's label); `update_info` is pushed
through the engine's own weight transfer (vLLM: start, update, finish with the version;
SGLang: update_weights_from_distributed), and without either the trainer pushed the weights
itself and the version is set (`update_weight_version`). Then the prefix caches that could
still hold K/V of the old weights are emptied (every SGLang backend; vLLM-dialect ones only
with `serve --no-cache-salt`, since their calls are otherwise salted per version:
proxy/upstream/sampling.py), the version is read back from every engine (vLLM `/weight_info`,
SGLang `/model_info`), the engines resume, and the hold reopens under `version`. Any step that
fails on any engine (a load, a flush, an engine that reports another version) keeps
dispatching held and the answer's error names the engine; the trainer retries the commit or
cancels. `cancel` resumes the engines and reopens on the old version.
With a `lease` (seconds), an update neither committed nor cancelled by then is cancelled, so a
trainer that dies mid-update does not hold every harness for ever.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from ...store.ids import new_id
from ...store.weights import WeightChecksums, version_digest
from ..context import CONTEXT, ProxyContext
from ..errors import BadRequest, Conflict
from ..hold import UpdateInProgress, UpdateMode, WeightUpdate
from ..upstream.backends import Backend
from ..upstream.exchange import now
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
    refused = [p for p in began["paused"] if not p["ok"]]
    if mode is UpdateMode.IN_PLACE and refused:
        # A request an engine did not freeze would sample across the update unrecorded.
        await replicated.cancel(ctx)
        names = ", ".join(f"{p['backend']} ({p['detail']})" for p in refused)
        return _failed(
            f"not every engine froze its requests for an in_place update: {names}; nothing is held",
            "pause_failed",
            began["paused"],
            ctx,
        )
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
    update_info = body.get("update_info")
    if update_info is not None and not isinstance(update_info, dict | list):
        raise BadRequest("'update_info' must be the engine's JSON object", param="update_info")
    model_path = body.get("model_path")
    if model_path is not None and (not isinstance(model_path, str) or not model_path):
        raise BadRequest("'model_path' must be a path the engines can read", param="model_path")
    if model_path is not None and update_info is not None:
        raise BadRequest("give 'model_path' or 'update_info', not both", param="update_info")
    load_format = body.get("load_format", "auto")
    if not isinstance(load_format, str):
        raise BadRequest("'load_format' must be a string", param="load_format")
    if ctx.hold.update is None:
        raise Conflict(
            "no weight update is under way: POST /v1/weights/begin first", code="no_update"
        )
    session, backends = ctx.client(), engine_control.controlled(ctx.pool.all())
    steps: list[dict[str, Any]] = []

    def held(message: str, code: str, results: list[engine_control.ControlResult]) -> web.Response:
        failed = "; ".join(f"{r.backend}: {r.detail}" for r in results if not r.ok)
        return _failed(f"{message}: {failed}; dispatching stays held", code, steps, ctx)

    if model_path is not None:
        order = {
            "model_path": model_path,
            "load_format": load_format,
            "weight_version": version,
            "abort_all_requests": ctx.hold.aborting,
            "flush_cache": True,
        }
        loaded = await engine_control.load_weights(session, ctx.pool.all(), order)
        steps += [r.as_dict() for r in loaded]
        if not all(r.ok for r in loaded):
            # Some engine may hold the new weights and some the old: nothing reopens.
            return held("not every backend loaded the weights", "weight_load_failed", loaded)
    else:

        async def label(backend: Backend) -> engine_control.ControlResult | None:
            routes = engine_control.version_routes(backend.kind, version, update_info)
            return await engine_control.send_all(session, backend, routes)

        labelled = await engine_control.each(backends, label)
        steps += [r.as_dict() for r in labelled]
        if not all(r.ok for r in labelled):
            code = "weight_update_failed" if update_info is not None else "weight_version_failed"
            return held("not every engine took the new weights' version", code, labelled)
    frozen = ctx.hold.update is not None and ctx.hold.update.mode is UpdateMode.IN_PLACE
    flushed = await engine_control.flush_prefix_caches(
        session, ctx.pool.all(), salted=ctx.settings.cache_salt, frozen=frozen
    )
    steps += [r.as_dict() for r in flushed]
    if not all(r.ok for r in flushed):
        # Reopening now would let calls read K/V of the old weights.
        return held("not every backend emptied its prefix cache", "cache_flush_failed", flushed)
    read = await engine_control.each(
        backends, lambda b: engine_control.read_version(session, b, version)
    )
    steps += [r.as_dict() for r in read]
    if not all(r.ok for r in read):
        # Calls stamped `version` would have been sampled by other weights.
        return held("an engine serves another weight version", "weight_version_mismatch", read)
    sums = await engine_control.each(backends, lambda b: engine_control.read_checksums(session, b))
    steps += [r.as_dict() for r in sums]
    digest = await _record_checksums(ctx, version, [r for r in sums if r.ok])
    resumed = await replicated.resume_engines(ctx)
    steps += [r.as_dict() for r in resumed]
    if not all(r.ok for r in resumed):
        return held("not every engine resumed", "resume_failed", resumed)
    held_for = await replicated.commit(ctx, version, digest)
    answer = {**weights_json(ctx), "held_seconds": held_for, "backends": steps}
    return respond({**answer, "weights_digest": digest})


async def cancel(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    if ctx.hold.update is None:
        raise Conflict("no weight update is under way", code="no_update")
    held, resumed = await replicated.cancel(ctx)
    return respond(
        {**weights_json(ctx), "held_seconds": held, "backends": [r.as_dict() for r in resumed]}
    )


async def _record_checksums(
    ctx: ProxyContext, version: str, read: list[engine_control.ControlResult]
) -> str | None:
    """Store each engine's checksums of `version`; returns the digest calls under it are sealed
    with (store/weights.py `version_digest`), None when no engine offers checksums."""
    digests = []
    for result in read:
        sums = {str(k): str(v) for k, v in result.value.items()}
        record = WeightChecksums(new_id(), version, result.backend, now(), sums)
        digests.append(record.digest)
        await ctx.store.record_weight_checksums(record)
    return version_digest(digests) if digests else None


def _failed(
    message: str, code: str, backends: list[dict[str, Any]], ctx: ProxyContext
) -> web.Response:
    error = {"message": message, "type": "upstream_error", "param": None, "code": code}
    return respond({**weights_json(ctx), "error": error, "backends": backends}, status=502)


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
