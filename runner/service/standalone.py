"""The rollout service as its own process, beside a proxy that runs elsewhere on this machine.

    python -m rolltap.runner.service --proxy http://127.0.0.1:8100 \\
        --proxy-socket /run/rolltap/proxy.sock --model SmolLM2-135M-Instruct --db URL

It shares the proxy's store (the same database) and sends its sandboxes to the proxy's unix
socket; it reads the policy's versions from the proxy's GET /v1/weights and forwards
/v1/weights requests there, so a trainer talks to this one address for both. Its own routes
need the admin token (--admin-token or ROLLTAP_ADMIN_TOKEN), which it also uses at the proxy.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware

from ...proxy.errors import Unauthorized, UpstreamUnavailable
from ...proxy.middleware import errors
from ...store import Store
from ..harnesses import adapters, builtins
from ..rollout import Pools
from .clock import RemoteClock
from .executor import LocalHost, local_executors
from .routes import mount
from .service import Service
from .spec import ServiceLimits

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PROXY_URL = web.AppKey("rolltap_proxy_url", str)


@dataclass(frozen=True)
class StandaloneSettings:
    proxy: str
    """The proxy's URL (its admin routes: /v1/weights)."""
    proxy_socket: Path
    """The proxy's unix socket, the sandboxes' only way out."""
    model: str
    """The served model name harnesses ask for."""
    logs_root: Path
    admin_token: str | None = None
    limits: ServiceLimits = field(default_factory=ServiceLimits)
    concurrency: int = 16


def make_app(store: Store, settings: StandaloneSettings) -> web.Application:
    limits = settings.limits
    size = settings.concurrency
    harnesses = adapters() | builtins()
    host = LocalHost(
        store=store,
        proxy_socket=settings.proxy_socket,
        model=lambda: settings.model,
        logs_root=settings.logs_root,
        pools=Pools.sized(size, size, size),
        harnesses=harnesses,
    )

    async def model() -> str:
        return settings.model

    service = Service(
        store,
        RemoteClock(settings.proxy, settings.admin_token),
        local_executors(host),
        harnesses=harnesses,
        model=model,
        limits=limits,
    )
    app = web.Application(
        middlewares=[errors, _auth(settings.admin_token)], client_max_size=64 << 20
    )
    app[PROXY_URL] = settings.proxy.rstrip("/")
    mount(app, service)
    app.router.add_route("*", "/v1/weights{tail:(/[a-z]+)?}", _forward_weights(settings))
    return app


def _auth(token: str | None) -> Middleware:
    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if token:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                raise Unauthorized("this service needs the admin token", code="invalid_admin_token")
        return await handler(request)

    return auth


def _forward_weights(settings: StandaloneSettings) -> Handler:
    """/v1/weights* to the proxy, whose weight hold holds the calls: one address for the trainer."""
    headers = {"Authorization": f"Bearer {settings.admin_token}"} if settings.admin_token else {}

    async def forward(request: web.Request) -> web.StreamResponse:
        url = request.app[PROXY_URL] + request.path_qs
        body = await request.read()
        sent = {**headers, "Content-Type": request.headers.get("Content-Type", "application/json")}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.request(
                    request.method, url, data=body, headers=sent, timeout=timeout
                ) as resp,
            ):
                answer = await resp.read()
                status, kind = resp.status, resp.content_type
        except aiohttp.ClientError as e:
            raise UpstreamUnavailable(
                f"the proxy at {settings.proxy} is unreachable: {e}"
            ) from None
        return web.Response(body=answer, status=status, content_type=kind)

    return forward


async def serve(store: Store, settings: StandaloneSettings, host: str, port: int) -> web.AppRunner:
    """Start listening; the caller owns `store` and must clean the runner up before closing it."""
    runner = web.AppRunner(make_app(store, settings), access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
