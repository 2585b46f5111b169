"""The proxy a batch's sandboxes talk to: started in this process, or one already running.

Sandboxes reach it only through its unix socket, which only this user and the sandbox user's
group may connect to, in a directory only they may enter. Started here, it serves the given
backends or, with none, the built-in engine (a child process, loaded once).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from ..proxy.answers import LIVE
from ..proxy.context import ProxySettings
from ..proxy.replay import Cassette
from ..proxy.server import RunningProxy, start_proxy
from ..proxy.tokenin.options import TokenInOptions
from ..store import Store
from .sandboxes.identity import sandbox_user


class BackendUnreachable(Exception):
    """A --backend that nothing answers at, or that cannot say which model it serves."""


@dataclass(frozen=True)
class ProxyHost:
    socket: Path
    model: str
    proxy: RunningProxy | None
    """None when the batch uses a proxy someone else runs."""

    def revoke(self, key: str) -> None:
        """Refuse the key at once in this process's proxy (the store's revocation reaches any
        other proxy on its next re-read of the rollout, within seconds)."""
        if self.proxy is not None:
            self.proxy.ctx.rollouts.revoke(key)

    def calls_recorded(self) -> float:
        return 0.0 if self.proxy is None else self.proxy.ctx.metrics.calls.total()

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
    max_tokens_cap: int | None = None,
    needs_model: bool = True,
    replay: Cassette | None = None,
    token_in: TokenInOptions | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> AsyncIterator[ProxyHost]:
    """`socket` given: use that running proxy (it must share this store's database). The
    built-in engine starts with engine.launch.ANSWER_LIMITS, then `engine_args`.

    `needs_model=False` with no backends: a proxy that serves no model, for a harness that makes no
    LLM call (the oracle); a call it makes anyway is refused and recorded. `replay`: the proxy
    answers from that cassette (`rolltap replay`), so it needs no model unless the cassette
    goes live."""
    if socket is not None:
        if not socket.exists():
            raise FileNotFoundError(f"no proxy socket at {socket}")
        if model is None:
            raise ValueError("--model is needed with a proxy that runs elsewhere")
        yield ProxyHost(socket, model, None)
        return
    async with contextlib.AsyncExitStack() as stack:
        urls = list(backends)
        if not urls and not needs_model:
            model = model or "none"
        elif not urls:
            from ..engine.launch import ANSWER_LIMITS, EngineProcess

            say("starting the built-in engine (loads the model once)...")
            args = (*ANSWER_LIMITS, *engine_args)
            engine = await EngineProcess.astart(engine_model, extra_args=args)
            stack.push_async_callback(asyncio.to_thread, engine.stop)
            urls = [engine.url]
            model = model or engine.model
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rolltap-proxy-")))
        sock = tmp / "proxy.sock"
        group = sandbox_user().gid
        settings = ProxySettings(
            backends=urls,
            port=0,
            unix_socket=str(sock),
            unix_socket_group=group,
            max_tokens_cap=max_tokens_cap,
            token_in=token_in or TokenInOptions(),
        )
        proxy = await start_proxy(settings, store, answers=LIVE if replay is None else replay)
        stack.push_async_callback(proxy.stop)
        if urls and not proxy.ctx.pool.healthy():
            # The proxy probed them before serving: every rollout would fail, one by one.
            raise BackendUnreachable(
                f"--backend {' '.join(urls)}: nothing answers there (connection refused); "
                "start the engine first, or check the URL"
            )
        # The socket is restricted now: let the sandboxes' group through its directory.
        os.chown(tmp, -1, group)
        tmp.chmod(0o750)
        if model is None:
            model = await served_model(urls[0])
        assert model is not None
        say(f"proxy on {proxy.url} (sandboxes: {sock}); model {model}")
        yield ProxyHost(sock, model, proxy)


async def expected_model(
    *,
    backends: Sequence[str] = (),
    model: str | None = None,
    engine_model: str | None = None,
    engine_args: Sequence[str] = (),
    needs_model: bool = True,
) -> str:
    """The model name `proxy_host` will serve with these arguments, known without starting
    an engine (a batch's default name and settings hold it): the one given, the first one the
    backend lists, "none", or the name the built-in engine will serve (its model's, or its
    last --served-model-name)."""
    if model is not None:
        return model
    if backends:
        return await served_model(backends[0])
    if not needs_model:
        return "none"
    from ..engine.model import resolve_model

    served = None
    for i, arg in enumerate(engine_args):
        if arg.startswith("--served-model-name="):
            served = arg.partition("=")[2]
        elif arg == "--served-model-name" and i + 1 < len(engine_args):
            served = engine_args[i + 1]
    return resolve_model(engine_model, served).served_name


def token_in_meta(token_in: TokenInOptions | None) -> dict[str, bool]:
    """A batch's rollout meta for its token-in choice: the rollout chooses token-in itself, so
    whichever proxy serves it (the run's own, one behind --proxy-socket, a Ray node's) does."""
    return {"token_in": True} if token_in is not None and token_in.enabled else {}


async def served_model(backend: str) -> str:
    """The first model `backend` lists."""
    url = backend.split("=", 1)[-1].rstrip("/").removesuffix("/v1") + "/v1/models"
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, timeout=aiohttp.ClientTimeout(total=30)) as resp,
        ):
            resp.raise_for_status()
            data = await resp.json()
    except aiohttp.ClientConnectorError as e:
        # The words the proxy's own probe gives (proxy_host), asked first or not.
        why = "connection refused" if isinstance(e.os_error, ConnectionRefusedError) else e.strerror
        raise BackendUnreachable(
            f"--backend {backend}: nothing answers there ({why or e}); start the engine first, "
            "or check the URL"
        ) from None
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        why = "no answer in 30 s" if isinstance(e, TimeoutError) else str(e) or type(e).__name__
        raise BackendUnreachable(
            f"--backend {backend}: GET {url} failed ({why}); pass --model to skip asking"
        ) from None
    listed = data.get("data") if isinstance(data, dict) else None
    models = [m["id"] for m in listed if isinstance(m, dict) and "id" in m] if listed else []
    if not models:
        raise BackendUnreachable(f"{url} lists no model; pass --model")
    return str(models[0])
