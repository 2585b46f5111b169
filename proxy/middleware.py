"""Errors become JSON in the client's dialect (OpenAI or Anthropic), with the right status."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from ..store import DatabaseUnavailable, StoreState, StoreStatus
from .errors import (
    BadRequest,
    NotFoundError,
    PayloadTooLarge,
    ProxyError,
    StoreUnavailable,
)

log = logging.getLogger("rolltap.proxy")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_anthropic(path: str) -> bool:
    return path.rstrip("/").endswith(("/v1/messages", "/v1/messages/count_tokens"))


def error_body(error: ProxyError, anthropic: bool) -> bytes:
    if anthropic:
        return orjson.dumps(
            {"type": "error", "error": {"type": error.anthropic_type, "message": error.message}}
        )
    return orjson.dumps(
        {
            "error": {
                "message": error.message,
                "type": error.type,
                "param": error.param,
                "code": error.code,
            }
        }
    )


def error_response(error: ProxyError, request: web.Request) -> web.Response:
    headers = {} if error.retry_after is None else {"Retry-After": str(error.retry_after)}
    return web.Response(
        status=error.status,
        body=error_body(error, is_anthropic(request.path)),
        content_type="application/json",
        headers=headers,
    )


def store_unavailable(reason: str | None, status: StoreStatus | None = None) -> StoreUnavailable:
    """The 503 for a call the store cannot take now; clients (and the SDKs) retry after."""
    down = status is None or status.state in (StoreState.DOWN, StoreState.FULL)
    full = status is not None and status.state is StoreState.FULL
    return StoreUnavailable(
        f"the proxy cannot record calls right now ({reason}); retry later",
        retry_after=5 if down else 1,
        code="store_full" if full else "store_unavailable" if down else "store_backlog",
    )


def _from_http(exc: web.HTTPException) -> ProxyError:
    if exc.status == 404:
        return NotFoundError(f"no route {exc.reason!s}".replace("Not Found", "for this path"))
    if exc.status == 413:
        return PayloadTooLarge(exc.text or "request body too large")
    if exc.status == 405:
        return BadRequest("method not allowed on this path", code="method_not_allowed")
    error = BadRequest(exc.text or exc.reason)
    error.status = exc.status
    return error


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ProxyError as e:
        return error_response(e, request)
    except DatabaseUnavailable as e:
        # A read the request needed, or a write that outlasted the outage limit. The client
        # (perhaps the policy) is not told where the database is; the log says what failed.
        log.warning("%s %s: %s", request.method, _path_for_humans(request), e)
        return error_response(store_unavailable("database unreachable"), request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        error = _from_http(e)
        if e.status == 404:
            return await _no_route(request)
        return error_response(error, request)
    except Exception:
        log.exception("unexpected error serving %s %s", request.method, _path_for_humans(request))
        return error_response(ProxyError("internal error in the proxy"), request)


async def _no_route(request: web.Request) -> web.Response:
    """A 404 in the client's error shape; when the path is a route but for the `/v1` its base URL
    lacks (`.../r/<key>/chat/completions`), the message says so."""
    message = f"no route for {request.method} {_path_for_humans(request)}"
    anthropic = is_anthropic(request.path)
    parts = request.path.split("/")
    at = 3 if len(parts) > 2 and parts[1] == "r" else 1
    if parts[at : at + 1] != ["v1"]:
        meant = "/".join([*parts[:at], "v1", *parts[at:]])
        match = await request.app.router.resolve(request.clone(rel_url=meant))
        if match.http_exception is None:
            message += f"; did you mean {_masked(meant)}? the base URL ends in /v1"
            anthropic = is_anthropic(meant)
    return web.Response(
        status=404,
        body=error_body(NotFoundError(message), anthropic),
        content_type="application/json",
    )


def _path_for_humans(request: web.Request) -> str:
    """The path with any rollout key masked: keys are secrets and never logged."""
    return _masked(request.path)


def _masked(path: str) -> str:
    parts = path.split("/")
    if len(parts) > 2 and parts[1] == "r":
        parts[2] = "<key>"
    return "/".join(parts)
