"""The viewer's aiohttp application: routes (GET only), headers, the token guard, error pages."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from sqlalchemy.exc import DBAPIError

from ..store import DatabaseUnavailable, NotFound
from .auth import token_guard
from .context import CONTEXT, UIContext
from .errors import BadQuery
from .lists import batch_page, batches_page, rollouts_page
from .rollout import body_json, call_page, rollout_page, tokens_fragment
from .templates import HERE
from .training_page import training_page

log = logging.getLogger("rolltap.ui")

# Everything the pages show was written by a model or a harness: no inline script or style may
# run even if some text slipped past escaping, and nothing is fetched from anywhere else.
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


def make_app(ctx: UIContext) -> web.Application:
    middlewares: list[Middleware] = [_headers, _errors]
    if ctx.settings.admin_token:
        middlewares.append(token_guard(ctx.settings.admin_token, _refuse))
    app = web.Application(middlewares=middlewares)
    app[CONTEXT] = ctx
    app.cleanup_ctx.append(_preload_tokenizer)
    app.router.add_get("/", batches_page)
    app.router.add_get("/batches/{batch_id:.+}", batch_page)
    app.router.add_get("/rollouts", rollouts_page)
    app.router.add_get("/training", training_page)
    app.router.add_get("/rollouts/{rollout_id}", rollout_page)
    app.router.add_get("/rollouts/{rollout_id}/calls/{seq}", call_page)
    app.router.add_get("/rollouts/{rollout_id}/calls/{seq}/tokens", tokens_fragment)
    app.router.add_get(
        "/rollouts/{rollout_id}/calls/{seq}/{part:request|engine|response}.json", body_json
    )
    static = app.router.add_static("/static/", HERE / "static", append_version=True)
    ctx.templates.add_global("static", lambda name: str(static.url_for(filename=name)))
    return app


async def _preload_tokenizer(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(app[CONTEXT].tokenizers.preload())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@web.middleware
async def _headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    response.headers.update(_HEADERS)
    if not request.path.startswith("/static/"):
        # The store changes under a running viewer; never show a stale page.
        response.headers["Cache-Control"] = "no-store"
    return response


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except NotFound as e:
        return _error(request, 404, str(e))
    except BadQuery as e:
        return _error(request, 400, str(e))
    except (DatabaseUnavailable, DBAPIError, OSError) as e:
        log.warning("store read failed for %s: %s", request.path, e)
        return _error(request, 503, f"the store cannot be read right now: {_first_line(e)}")
    except web.HTTPException as e:
        if e.status < 400:
            raise
        page = _error(request, e.status, e.text or e.reason)
        if "Allow" in e.headers:
            page.headers["Allow"] = e.headers["Allow"]
        return page


def _refuse(request: web.Request) -> web.Response:
    return _error(
        request,
        401,
        "this viewer needs its admin token: open it once as …/?token=<admin token> "
        "(or send Authorization: Bearer <admin token>)",
    )


def _error(request: web.Request, status: int, message: str) -> web.Response:
    ctx = request.app[CONTEXT]
    return ctx.templates.page("error.html", status=status, code=status, message=message)


def _first_line(e: BaseException) -> str:
    text = str(e.orig if isinstance(e, DBAPIError) else e).strip()
    return text.splitlines()[0] if text else type(e).__name__
