"""An event loop on a daemon thread of its own: sync callers (rolltap.store.open, the trainer's
`Client`) run coroutines there. Nothing but asyncio, so importing it loads no store or server."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """An event loop running forever on a daemon thread of its own."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine there and block until it is done (from another thread)."""
        return self.submit(coro).result()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Start a coroutine there and return at once (from another thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine there and await it from the caller's loop (cancelling it with us)."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
