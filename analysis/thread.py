"""Heavy reads on a thread of their own: trajectory assembly and drift classification.

A rollout of thousands of calls takes seconds of CPU to assemble. Run on the caller's event loop
(the proxy's, whose admin API and finished-rollout analysis ask for it) it would stall every call
in flight; run in the group-commit writer's transaction it would hold every record back. So it
runs on a private event loop thread with its own connection pool, started on first use.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from ..loop_thread import LoopThread
from ..store.database import Database, open_database
from ..store.url import DatabaseURL

if TYPE_CHECKING:
    # Loaded on the first build: a store that never assembles a trajectory never imports it.
    from ..store.packing import IdArray
    from ..store.records import RolloutView
    from .drift import Detokenizer
    from .trajectory import RolloutTrajectories

CHUNK = 64
"""Rollouts assembled per round of queries."""

T = TypeVar("T")


class _OnLoop:
    """A detokenizer used from the analysis thread, still running on its owner's loop (an
    engine client's HTTP session belongs to the loop that made it)."""

    def __init__(self, inner: Detokenizer, loop: asyncio.AbstractEventLoop) -> None:
        self._inner = inner
        self._loop = loop

    async def detokenize(self, sequences: Sequence[IdArray]) -> list[str]:
        future = asyncio.run_coroutine_threadsafe(self._inner.detokenize(sequences), self._loop)
        return await asyncio.wrap_future(future)


class AnalysisThread:
    def __init__(self, url: DatabaseURL, *, read_only: bool = False) -> None:
        self._url = url
        self._read_only = read_only
        self._thread: LoopThread | None = None
        self._db: Database | None = None
        self._lock = threading.Lock()

    async def build(
        self, rollouts: Sequence[RolloutView], detokenizer: Detokenizer | None
    ) -> list[RolloutTrajectories]:
        """trajectory.build, off the caller's loop."""
        if not rollouts:
            return []
        owner = asyncio.get_running_loop()
        detok = None if detokenizer is None else _OnLoop(detokenizer, owner)
        return await self._started().run_async(self._build(rollouts, detok))

    async def _build(
        self, rollouts: Sequence[RolloutView], detokenizer: Detokenizer | None
    ) -> list[RolloutTrajectories]:
        from . import trajectory

        if self._db is None:  # only ever touched on the analysis thread
            self._db = open_database(self._url, read_only=self._read_only)
        return await trajectory.build(self._db, rollouts, detokenizer)

    def _started(self) -> LoopThread:
        with self._lock:
            if self._thread is None:
                self._thread = LoopThread("rolltap-analysis")
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
