"""The store's read thread: heavy reads (trajectory assembly, drift classification) off the
caller's event loop.

A rollout of thousands of calls takes seconds of CPU to assemble. Run on the caller's event loop
(the proxy's, whose admin API and finished-rollout analysis ask for it) it would stall every call
in flight; run in the group-commit writer's transaction it would hold every record back. So it
runs on a private event loop thread with its own connection pool (an asyncio engine's
connections belong to the loop that made them), started on first use: one per store.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from ..loop_thread import LoopThread
from .database import Database, open_database
from .url import DatabaseURL

P = ParamSpec("P")
T = TypeVar("T")


class ReadThread:
    def __init__(self, url: DatabaseURL, *, read_only: bool = False) -> None:
        self._url = url
        self._read_only = read_only
        self._thread: LoopThread | None = None
        self._db: Database | None = None
        self._lock = threading.Lock()

    async def run(
        self,
        fn: Callable[Concatenate[Database, P], Coroutine[Any, Any, T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """`fn(db, *args, **kwargs)` on the read thread, `db` its own; awaited from the caller's
        loop. What `fn` is handed that belongs to the caller's loop must be used through it."""
        return await self._started().run_async(self._run(fn, *args, **kwargs))

    async def _run(
        self,
        fn: Callable[Concatenate[Database, P], Coroutine[Any, Any, T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        if self._db is None:  # only ever touched on the read thread
            self._db = open_database(self._url, read_only=self._read_only)
        return await fn(self._db, *args, **kwargs)

    def _started(self) -> LoopThread:
        with self._lock:
            if self._thread is None:
                self._thread = LoopThread("rolltap-read")
            return self._thread

    async def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        if self._db is not None:
            await thread.run_async(self._db.dispose())
            self._db = None
        await asyncio.to_thread(thread.stop)
