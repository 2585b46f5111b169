"""Pause and resume around weight updates: held calls wait, in-flight calls finish."""

from __future__ import annotations

import asyncio


class Gate:
    def __init__(self, weight_version: str | None = None) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.inflight = 0
        self.waiting = 0
        self.weight_version = weight_version

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    async def enter(self) -> str | None:
        """Wait while paused, then count the call as in flight; returns the version in force."""
        if not self._open.is_set():
            self.waiting += 1
            try:
                await self._open.wait()
            finally:
                self.waiting -= 1
        self.inflight += 1
        self._idle.clear()
        return self.weight_version

    def leave(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    def pause(self) -> None:
        self._open.clear()

    async def drained(self, timeout: float | None = None) -> bool:
        """True once no call is in flight (False if the timeout passed first)."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def resume(self, weight_version: str | None = None) -> None:
        if weight_version is not None:
            self.weight_version = weight_version
        self._open.set()
