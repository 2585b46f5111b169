"""Waiting in a test for something another task or process brings about."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest


async def until(condition: Callable[[], object], timeout: float = 20.0) -> None:
    """Return once `condition()` is true; fail the test after `timeout` seconds."""
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    pytest.fail("condition never held")
