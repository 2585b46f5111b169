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

vLLM 0.33's RL control plane (vllm/entrypoints/rl/online/api_router.py), which the proxy drives
on every vLLM-kind backend (proxy/control/engine_control.py), in the same shapes:
`POST /pause?mode=abort|wait` (abort ends running requests with "abort"; wait answers once none
runs; `keep`, freezing requests mid-answer, is refused with 400: this engine's scheduler does
not freeze rows, so an in_place update needs vLLM or SGLang), `POST /resume`, `GET /is_paused`,
`POST /start_weight_update` (nothing to open), `POST /update_weights` (400: no transfer engine
here; load a checkpoint with /update_weights_from_disk), `POST /finish_weight_update
{"weight_version"}` and `POST /update_weight_version {"new_version"}` (set the label between two
steps), `GET /weight_info`, `POST /weight_checker {"action": "checksum" | "compare", "baseline"}`
(vLLM's per-parameter SHA-256 of the raw bytes, model/weight_checksum.py's rule; `reset`, which
zeroes the weights, is refused). New requests are not refused while paused: the proxy holds them.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable

import torch
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
    app.router.add_post("/pause", pause)
    app.router.add_post("/resume", resume)
    app.router.add_get("/is_paused", is_paused)
    app.router.add_post("/start_weight_update", start_weight_update)
    app.router.add_post("/update_weights", update_weights)
    app.router.add_post("/finish_weight_update", finish_weight_update)
    app.router.add_post("/update_weight_version", update_weight_version)
    app.router.add_get("/weight_info", weight_info)
    app.router.add_post("/weight_checker", weight_checker)


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


# -- vLLM's RL control plane -----------------------------------------------------------------

PAUSE_POLL = 0.02
"""Seconds between two looks at the scheduler while `/pause?mode=wait` waits for it to idle."""


async def pause(request: web.Request) -> web.Response:
    engine = ready_engine(request)
    mode = request.query.get("mode", "abort")
    if mode not in ("abort", "wait", "keep"):
        raise BadRequest("`mode` must be abort, wait or keep", "mode")
    if mode == "keep":
        # vLLM's route answers a ValueError from its engine with 400 {"error": ...}.
        why = "this engine does not freeze running requests (mode=keep): use wait or abort"
        return json_response({"error": why}, status=400)
    slot = request.app[SLOT]
    slot.paused = True
    if mode == "abort":
        engine.batcher.abort_all()
    while True:
        stats = engine.batcher.stats()
        if stats.running == 0 and stats.waiting == 0:
            break
        await asyncio.sleep(PAUSE_POLL)
    return json_response({"status": "paused"})


async def resume(request: web.Request) -> web.Response:
    ready_engine(request)
    request.app[SLOT].paused = False
    return json_response({"status": "resumed"})


async def is_paused(request: web.Request) -> web.Response:
    ready_engine(request)
    return json_response({"is_paused": request.app[SLOT].paused})


async def start_weight_update(request: web.Request) -> web.Response:
    ready_engine(request)
    return json_response({"message": "Weight update started"})


async def update_weights(request: web.Request) -> web.Response:
    ready_engine(request)
    why = "this engine has no weight transfer engine: load a checkpoint (update_weights_from_disk)"
    return json_response({"error": why}, status=400)


async def finish_weight_update(request: web.Request) -> web.Response:
    await _set_version(request, "weight_version")
    return json_response({"message": "Weight update finished"})


async def update_weight_version(request: web.Request) -> web.Response:
    version = await _set_version(request, "new_version")
    return json_response({"success": True, "new_version": version})


async def weight_info(request: web.Request) -> web.Response:
    engine = ready_engine(request)
    return json_response({"weight_version": engine.batcher.weight_version})


async def _set_version(request: web.Request, key: str) -> str:
    engine = ready_engine(request)
    version = Fields(await read_json(request)).string(key)
    if version is None:
        return engine.batcher.weight_version
    async with request.app[SLOT].weights_lock:
        # No weight changes: the label moves between two steps, the cache stays.
        outcome = await _swap(engine.batcher, _unchanged, version, False, False)
    return outcome.weight_version


async def weight_checker(request: web.Request) -> web.Response:
    engine = ready_engine(request)
    f = Fields(await read_json(request))
    action = f.string("action")
    if action not in ("checksum", "compare"):
        raise BadRequest("`action` must be checksum or compare (reset is not offered)", "action")
    baseline = f.data.get("baseline")
    if action == "compare" and not isinstance(baseline, dict):
        raise BadRequest("action='compare' requires a 'baseline' object", "baseline")
    async with request.app[SLOT].weights_lock:
        # No update swaps the weights while they are read.
        sums = await asyncio.to_thread(checksums, engine.lm.model)
    if action == "checksum":
        return json_response({"checksums": sums})
    assert isinstance(baseline, dict)
    mismatches = sorted(k for k in sums.keys() | baseline.keys() if sums.get(k) != baseline.get(k))
    return json_response({"match": not mismatches, "mismatches": mismatches})


def checksums(model: torch.nn.Module) -> dict[str, str]:
    """vLLM's rule: SHA-256 of each parameter's raw bytes, by name (a tied weight once)."""
    return {
        name: hashlib.sha256(
            weight.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        ).hexdigest()
        for name, weight in model.named_parameters()
    }
