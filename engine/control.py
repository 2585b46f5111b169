"""Control routes for RL loops: weight updates from disk, abort-all, the current weight version.

`POST /update_weights_from_disk` takes SGLang's body (`model_path`, `load_format`,
`abort_all_requests`, `weight_version`, `flush_cache`) and answers in SGLang's shape
(`{"success", "message", "num_paused_requests"}`, 400 with `success: false` on failure) plus
`weight_version` and `num_aborted_requests`. Nothing fails while it runs: new requests wait,
running ones finish (or end with finish_reason "abort" when `abort_all_requests` is true, with
what they sampled so far), the prefix cache is emptied, and waiting requests run on the new
weights. A missing `weight_version` keeps the label, as SGLang does; rolltap always sends one.

`POST /abort_requests` with `{}` (vLLM's dev-mode route) ends every request now with "abort".
`POST /reset_prefix_cache` (vLLM's dev-mode route) and `POST /flush_cache` (SGLang's) empty the
prefix cache between two steps, for a trainer that changed the weights some other way; they
answer `{"success": true}`.
`GET /get_weight_version` (SGLang) answers `{"weight_version": ...}`; generation routes report
the label per choice when asked (`return_weight_versions`, vLLM's spans).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from .batcher import Batcher, UpdateOutcome
from .endpoint import SLOT, json_response, read_json, ready_engine
from .errors import BadRequest
from .protocol import Fields
from .weights import copier, read_weights


def add_routes(app: web.Application) -> None:
    app.router.add_post("/update_weights_from_disk", update_weights_from_disk)
    app.router.add_post("/abort_requests", abort_requests)
    app.router.add_get("/get_weight_version", get_weight_version)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    app.router.add_post("/flush_cache", reset_prefix_cache)


async def update_weights_from_disk(request: web.Request) -> web.Response:
    engine = ready_engine(request)
    slot = request.app[SLOT]
    try:
        f = Fields(await read_json(request))
        model_path = f.string("model_path")
        if not model_path:
            raise BadRequest("`model_path` must name a weights file or directory", "model_path")
        version = f.string("weight_version")
        abort = f.boolean("abort_all_requests", False)
        flush = f.boolean("flush_cache", True)
        load_format = f.string("load_format") or "auto"
        # One update at a time; reading and checking the file runs beside generation.
        async with slot.weights_lock:
            model = engine.lm.model
            tensors = await asyncio.to_thread(read_weights, model_path, model, load_format)
            outcome = await _swap(engine.batcher, copier(model, tensors), version, abort, flush)
    except BadRequest as e:
        return _answer(False, e.message, engine.batcher.weight_version)
    if outcome.error is not None:
        return _answer(False, f"the update failed: {outcome.error}", outcome.weight_version)
    return _answer(
        True,
        f"weights from {model_path} loaded",
        outcome.weight_version,
        paused=outcome.paused,
        aborted=outcome.aborted,
    )


async def reset_prefix_cache(request: web.Request) -> web.Response:
    engine = ready_engine(request)
    async with request.app[SLOT].weights_lock:
        # An update that changes no weight: it runs between two steps and empties the cache.
        outcome = await _swap(engine.batcher, _unchanged, None, False, True)
    message = "prefix cache emptied" if outcome.error is None else outcome.error
    return json_response({"success": outcome.error is None, "message": message})


def _unchanged() -> None:
    """The weights stay as they are."""


async def _swap(
    batcher: Batcher, apply: Callable[[], None], version: str | None, abort: bool, flush: bool
) -> UpdateOutcome:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[UpdateOutcome] = loop.create_future()

    def settle(outcome: UpdateOutcome) -> None:
        if not done.done():
            done.set_result(outcome)

    def report(outcome: UpdateOutcome) -> None:
        loop.call_soon_threadsafe(settle, outcome)

    batcher.update_weights(apply, report, weight_version=version, abort=abort, flush_cache=flush)
    return await done


def _answer(
    success: bool, message: str, version: str, *, paused: int = 0, aborted: int = 0
) -> web.Response:
    body = {
        "success": success,
        "message": message,
        "num_paused_requests": paused,
        "num_aborted_requests": aborted,
        "weight_version": version,
    }
    return json_response(body, status=200 if success else 400)


async def abort_requests(request: web.Request) -> web.Response:
    engine = ready_engine(request)
    f = Fields(await read_json(request))
    if f.data.get("request_ids"):
        raise BadRequest("only abort-all (`{}`) is supported", "request_ids")
    engine.batcher.abort_all()
    return json_response({"aborted": "all"})


async def get_weight_version(request: web.Request) -> web.Response:
    engine = ready_engine(request)
    return json_response({"weight_version": engine.batcher.weight_version})
