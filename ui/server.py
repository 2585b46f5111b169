"""Run the viewer: open the store read-only, listen, and stop on a signal."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from ..engine.errors import ModelLoadError
from ..engine.model import DEFAULT_SERVED_NAME, default_gguf_path
from ..store import Store
from .app import make_app
from .auth import check_binding
from .context import UIContext, UISettings
from .tokens import Tokenizers


@dataclass
class RunningUI:
    url: str
    store: Store
    _runner: web.AppRunner

    async def stop(self) -> None:
        await self._runner.cleanup()


async def start_ui(settings: UISettings, store: Store) -> RunningUI:
    """Start listening; the caller owns the store and must `stop()` before closing it."""
    check_binding(settings.host, settings.admin_token)
    ctx = UIContext(store, settings, Tokenizers(settings.tokenizer, _builtin_model()))
    runner = web.AppRunner(make_app(ctx), access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, settings.host, settings.port).start()
    port = runner.addresses[0][1] if runner.addresses else settings.port
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return RunningUI(f"http://{host}:{port}", store, runner)


async def serve_until_stopped(
    settings: UISettings, db_url: str | None, on_ready: Callable[[RunningUI], None]
) -> None:
    """The `rolltap ui` process."""
    check_binding(settings.host, settings.admin_token)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    store = await Store.connect(db_url, read_only=True)
    try:
        ui = await start_ui(settings, store)
        try:
            on_ready(ui)
            await stop.wait()
        finally:
            await ui.stop()
    finally:
        await store.close()


def _builtin_model() -> tuple[str, Path] | None:
    """(served name, GGUF) of the built-in engine's default model, when it is installed."""
    try:
        return DEFAULT_SERVED_NAME, default_gguf_path()
    except ModelLoadError:
        return None
