"""Run the proxy: TCP for harnesses and trainers, a unix socket for sandboxes, until stopped."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from asyncio import FIRST_COMPLETED
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from aiohttp import web

from ..store import Store
from ..store.spill import spill_root
from .answers import LIVE, AnswerSource
from .app import Extension, make_app, make_context
from .context import ProxyContext, ProxySettings
from .replay.retries import RetriesServed

log = logging.getLogger("rolltap.proxy")
_HANDLERS_AT_STOP = 5.0
"""Seconds a stopping proxy waits for handlers still running (serve_until_stopped drains
first); aiohttp's default is 60."""


@dataclass
class RunningProxy:
    url: str
    unix_socket: str | None
    ctx: ProxyContext
    _runners: list[web.AppRunner]

    async def stop(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()
        if self.unix_socket:
            # aiohttp closes the socket but leaves its file; a later start would unlink it, but
            # until then it names a server that is gone (and a stale file in someone's /tmp).
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.unix_socket)


async def start_proxy(
    settings: ProxySettings,
    store: Store,
    extensions: Sequence[Extension] = (),
    answers: AnswerSource = LIVE,
) -> RunningProxy:
    """Start listening; the caller owns the store and must `stop()` before closing it.
    `extensions` add routes to the TCP app (the rollout service of `serve --runner`); `answers`:
    where calls' answers come from (proxy/answers.py: the engine, or a cassette)."""
    ctx = make_context(settings, store)
    # A harness's retry gets the answer its first call got, not a new draw (replay/retries.py).
    answers = RetriesServed(answers)
    app = make_app(ctx, extensions=extensions, answers=answers)
    # A client that hangs up cancels its handler, which aborts the engine request (relay.py).
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        handler_cancellation=True,
        shutdown_timeout=_HANDLERS_AT_STOP,
    )
    await runner.setup()
    site = web.TCPSite(
        runner,
        settings.host,
        settings.port,
        backlog=4096,
        reuse_address=True,
        reuse_port=settings.workers > 1 or None,
    )
    await site.start()
    runners = [runner]
    port = runner.addresses[0][1] if runner.addresses else settings.port
    if settings.unix_socket:
        sandbox_runner = web.AppRunner(
            make_app(ctx, for_sandboxes=True, answers=answers),
            access_log=None,
            handle_signals=False,
            handler_cancellation=True,
            shutdown_timeout=_HANDLERS_AT_STOP,
        )
        await sandbox_runner.setup()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(settings.unix_socket)
        await web.UnixSite(sandbox_runner, settings.unix_socket, backlog=4096).start()
        restrict_socket(settings.unix_socket, settings.unix_socket_group)
        runners.append(sandbox_runner)
    return RunningProxy(f"http://{settings.host}:{port}", settings.unix_socket, ctx, runners)


def restrict_socket(path: str, group: int | None) -> None:
    """Only the proxy's user and `group` (the sandboxes') may connect. Until this runs the
    socket has the umask's mode: put it in a directory only this user can enter, and open the
    directory afterwards (runner/host.py does)."""
    if group is None:
        os.chmod(path, 0o600)
        return
    os.chown(path, -1, group)
    os.chmod(path, 0o660)


def _tune_gc() -> None:
    """Keep the cyclic GC off the hot path, and hand the GIL over sooner.

    Every engine answer allocates thousands of small objects, so collections run constantly,
    and each full one walked everything imported at startup (SQLAlchemy, aiohttp, numpy): tens
    of milliseconds charged to whichever request allocated. Freezing the startup heap takes it
    out of collections; a larger first threshold makes the young ones rarer and cheap.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    # The store's writer thread gives the GIL up for zlib and sqlite many times per batch; at the
    # default 5 ms interval each time can cost it 5 ms to get it back from the event loop, and
    # every response waits for that writer.
    sys.setswitchinterval(0.0005)


async def serve_until_stopped(
    settings: ProxySettings,
    db_url: str | None,
    *,
    on_ready: Callable[[RunningProxy], None] | None = None,
    start_engine: Callable[[], Awaitable[tuple[str, Callable[[], Awaitable[None]]]]] | None = None,
    extensions: Sequence[Extension] = (),
    drain_seconds: float = 10.0,
    say: Callable[[str], None] = log.warning,
) -> None:
    """The `rolltap serve` process: store, optional built-in engine, proxy; stop on a signal.

    Stopping: calls in flight get `drain_seconds` to finish (a second signal cuts that short),
    then the built-in engine is stopped, mid-generation if need be, so the calls left end (and
    are recorded) at once; then the proxy and the store close."""
    stop = asyncio.Event()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        stop.set()
        if signals > 1:
            hurry.set()

    hurry = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    store = await Store.connect(db_url, spill=spill_root(settings.store_spill))
    stop_engine: Callable[[], Awaitable[None]] | None = None
    try:
        if not settings.backends and start_engine is not None:
            engine_url, stop_engine = await start_engine()
            settings.backends = [engine_url]
            settings.builtin_engine = True
        proxy = await start_proxy(settings, store, extensions)
        _tune_gc()
        try:
            if on_ready is not None:
                on_ready(proxy)
            await stop.wait()
            await _drain(proxy, drain_seconds, hurry, say)
            if stop_engine is not None:
                await stop_engine()
                stop_engine = None
        finally:
            await proxy.stop()
    finally:
        await store.close()
        if stop_engine is not None:
            await stop_engine()


async def _drain(
    proxy: RunningProxy, seconds: float, hurry: asyncio.Event, say: Callable[[str], None]
) -> None:
    hold = proxy.ctx.hold
    if not hold.inflight:
        return
    say(
        f"stopping: waiting up to {seconds:g} s for {hold.inflight} call(s) in flight "
        "(signal again to stop now)"
    )
    drained = asyncio.ensure_future(hold.drained())
    hurried = asyncio.ensure_future(hurry.wait())
    try:
        await asyncio.wait({drained, hurried}, timeout=seconds, return_when=FIRST_COMPLETED)
    finally:
        drained.cancel()
        hurried.cancel()
    if hold.inflight:
        say(f"stopping now: {hold.inflight} call(s) still in flight end as failed")
