"""Waiting in a test for something another task or process brings about: one helper for every
suite (a condition may be a plain function or a coroutine function)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

import pytest


async def until(
    condition: Callable[[], object] | Callable[[], Awaitable[object]],
    what: str = "the condition",
    *,
    timeout: float = 20.0,
    every: float = 0.02,
) -> None:
    """Return once `condition()` (awaited when it is a coroutine) is true; fail the test,
    naming `what`, after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        held = condition()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        if asyncio.get_running_loop().time() >= deadline:
            pytest.fail(f"never happened within {timeout:g} s: {what}")
        await asyncio.sleep(every)
