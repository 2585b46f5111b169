"""The proxy a batch's sandboxes talk to: started in this process, or one already running.

Sandboxes reach it only through its unix socket. Started here, it serves the given backends or,
with none, the built-in engine (a child process, loaded once).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from rolltap.proxy.context import ProxySettings
from rolltap.proxy.server import RunningProxy, start_proxy
from rolltap.store import Store


@dataclass(frozen=True)
class ProxyHost:
    socket: Path
    model: str
    proxy: RunningProxy | None
    """None when the batch uses a proxy someone else runs."""

    def tokens_recorded(self) -> float:
        if self.proxy is None:
            return 0.0
        tokens = self.proxy.ctx.metrics.tokens
        return tokens.value(kind="prompt") + tokens.value(kind="completion")


@contextlib.asynccontextmanager
async def proxy_host(
    store: Store,
    *,
    backends: Sequence[str] = (),
    model: str | None = None,
    socket: Path | None = None,
    engine_model: str | None = None,
    engine_args: Sequence[str] = (),
    say: Callable[[str], None] = lambda _: None,
) -> AsyncIterator[ProxyHost]:
    """`socket` given: use that running proxy (it must share this store's database)."""
    if socket is not None:
        if not socket.exists():
            raise FileNotFoundError(f"no proxy socket at {socket}")
        if model is None:
            raise ValueError("--model is needed with a proxy that runs elsewhere")
        yield ProxyHost(socket, model, None)
        return
    async with contextlib.AsyncExitStack() as stack:
        urls = list(backends)
        if not urls:
            from rolltap.engine.launch import EngineProcess

            say("starting the built-in engine (loads the model once)...")
            engine = await EngineProcess.astart(engine_model, extra_args=engine_args)
            stack.push_async_callback(asyncio.to_thread, engine.stop)
            urls = [engine.url]
            model = model or engine.model
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rolltap-proxy-")))
        sock = tmp / "proxy.sock"
        settings = ProxySettings(backends=urls, port=0, unix_socket=str(sock))
        proxy = await start_proxy(settings, store)
        stack.push_async_callback(proxy.stop)
        if model is None:
            model = await _served_model(urls[0])
        say(f"proxy on {proxy.url} (sandboxes: {sock}); model {model}")
        yield ProxyHost(sock, model, proxy)


async def _served_model(backend: str) -> str:
    url = backend.split("=", 1)[-1].rstrip("/").removesuffix("/v1") + "/v1/models"
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, timeout=aiohttp.ClientTimeout(total=30)) as resp,
    ):
        data = await resp.json()
    models = [m["id"] for m in data.get("data", [])]
    if not models:
        raise ValueError(f"{url} lists no model; pass --model")
    return str(models[0])
