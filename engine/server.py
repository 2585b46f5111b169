"""The aiohttp application: routes, the error middleware, and the small non-generating routes."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aiohttp import web

from rolltap import __version__

from . import control, routes
from .core import GenerationFailed
from .endpoint import SLOT, EngineSlot, check_model, json_response, read_json, ready_engine
from .errors import BadRequest, NotFound, PayloadTooLarge, RequestError
from .protocol import Fields

DEFAULT_MAX_BODY = 64 * 1024 * 1024


def make_app(slot: EngineSlot, max_body: int = DEFAULT_MAX_BODY) -> web.Application:
    app = web.Application(client_max_size=max_body, middlewares=[_errors])
    app[SLOT] = slot
    app.router.add_post("/v1/chat/completions", routes.chat_completions)
    app.router.add_post("/v1/completions", routes.completions)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/stats", stats)
    control.add_routes(app)
    return app


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except RequestError as e:
        return json_response(e.body(), status=e.status)
    except web.HTTPRequestEntityTooLarge:
        return _error(PayloadTooLarge("the request body is too large"))
    except web.HTTPNotFound:
        return _error(NotFound(f"no route {request.method} {request.path}"))
    except web.HTTPMethodNotAllowed as e:
        body = BadRequest(f"method {e.method} not allowed on {request.path}").body()
        body["error"]["type"], body["error"]["code"] = "MethodNotAllowedError", 405
        return json_response(body, status=405)
    except GenerationFailed as e:
        err = {"message": str(e), "type": "InternalServerError", "param": None, "code": 500}
        return json_response({"error": err}, status=500)


def _error(e: RequestError) -> web.Response:
    return json_response(e.body(), status=e.status)


async def health(request: web.Request) -> web.Response:
    if request.app[SLOT].engine is None:
        return json_response({"status": "loading"}, status=503)
    return web.Response(status=200)


async def version(request: web.Request) -> web.Response:
    return json_response({"version": __version__, "engine": "rolltap"})


async def models(request: web.Request) -> web.Response:
    engine = ready_engine(request)
    slot = request.app[SLOT]
    card = {
        "id": engine.name,
        "object": "model",
        "created": int(slot.started),
        "owned_by": "rolltap",
        "root": str(engine.lm.source.directory / (engine.lm.source.gguf_file or "")),
        "parent": None,
        "max_model_len": engine.lm.max_model_len,
    }
    return json_response({"object": "list", "data": [card]})


async def stats(request: web.Request) -> web.Response:
    engine = ready_engine(request)
    body = asdict(engine.batcher.stats())
    body["decode_steps_by_batch"] = {str(k): v for k, v in body["decode_steps_by_batch"].items()}
    settings = {
        "max_model_len": engine.lm.max_model_len,
        "trained_max_model_len": engine.lm.trained_len,
        "prefix_caching": engine.batcher.prefix_cache_capacity > 0,
        "prefix_cache_capacity_tokens": engine.batcher.prefix_cache_capacity,
        "default_max_tokens": engine.limits.default_max_tokens,
        "max_tokens_cap": engine.limits.max_tokens_cap,
    }
    body["weight_version"] = engine.batcher.weight_version
    return json_response({"model": engine.name, "settings": settings, **body})


async def tokenize(request: web.Request) -> web.Response:
    engine = ready_engine(request)
    f = Fields(await read_json(request))
    check_model(engine, f.string("model"))
    if f.data.get("messages") is not None:
        messages = f.array("messages") or []
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise BadRequest("`messages` must be objects with a string `role`", "messages")
        tools = f.array("tools")
        rendered = engine.render(
            messages,
            tools or None,
            add_generation_prompt=f.boolean("add_generation_prompt", True),
            continue_final_message=f.boolean("continue_final_message", False),
            template_kwargs=f.mapping("chat_template_kwargs"),
        )
        ids = rendered.token_ids
        if f.boolean("add_special_tokens", False):
            ids = engine.encode(rendered.text, add_special_tokens=True)
    else:
        prompt = f.string("prompt")
        if prompt is None:
            raise BadRequest("give `prompt` (text) or `messages`", "prompt")
        ids = engine.encode(prompt, f.boolean("add_special_tokens", True))
    body: dict[str, Any] = {
        "count": len(ids),
        "max_model_len": engine.lm.max_model_len,
        "tokens": ids,
        "token_strs": None,
    }
    if f.boolean("return_token_strs", False):
        body["token_strs"] = list(engine.lm.tokenizer.convert_ids_to_tokens(ids))
    return json_response(body)


async def detokenize(request: web.Request) -> web.Response:
    engine = ready_engine(request)
    f = Fields(await read_json(request))
    check_model(engine, f.string("model"))
    ids = f.token_ids("tokens")
    if ids is None:
        raise BadRequest("`tokens` must be a list of token ids", "tokens")
    engine.check_ids(ids, "tokens")
    return json_response({"prompt": engine.decode(ids)})
