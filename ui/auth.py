"""Who may read the viewer: anyone on this machine when it listens on loopback; with an admin
token (required beyond loopback), only a browser that presented it once, or a Bearer header."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from ..proxy.control.admin import ExposedWithoutToken, is_loopback

COOKIE = "rolltap_ui"


def check_binding(host: str, token: str | None) -> None:
    """The proxy's rule (one test of what loopback is), with what the viewer would expose."""
    if token or is_loopback(host):
        return
    raise ExposedWithoutToken(
        f"--host {host} reaches beyond this machine and the viewer shows every recorded prompt "
        "and answer: set --admin-token (or ROLLTAP_ADMIN_TOKEN), or listen on 127.0.0.1"
    )


def token_guard(token: str, refuse: Callable[[web.Request], web.Response]) -> Middleware:
    """A middleware: `?token=` once sets an HttpOnly cookie (then the URL drops it), after that
    the cookie or an `Authorization: Bearer` header lets requests through; `refuse` answers the
    rest. The cookie holds a digest of the token, not the token."""
    cookie = hmac.new(token.encode(), b"rolltap-ui", hashlib.sha256).hexdigest()
    bearer = f"Bearer {token}"

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.query.get("token")
        if given is not None and _same(given, token):
            rest = [(k, v) for k, v in request.rel_url.query.items() if k != "token"]
            redirect = web.HTTPSeeOther(location=str(request.rel_url.with_query(rest)))
            redirect.set_cookie(COOKIE, cookie, httponly=True, samesite="Strict", path="/")
            raise redirect
        if _same(request.headers.get("Authorization", ""), bearer) or _same(
            request.cookies.get(COOKIE, ""), cookie
        ):
            return await handler(request)
        return refuse(request)

    return guard


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())
