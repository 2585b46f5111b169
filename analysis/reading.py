"""Trajectories read through the async store: assembled on its read thread (store/read_thread.py,
off the caller's loop), a rollout, a few or a selection at a time; a rollout's analysis recorded.

    from rolltap.analysis.reading import rollout_trajectories, trajectories
    built = await rollout_trajectories(store, rollout_id)
    async for t in trajectories(store, batch="step-12", status="finished"): ...
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from . import trajectory

if TYPE_CHECKING:
    from ..store.packing import IdArray
    from ..store.records import RolloutView
    from ..store.store import Store
    from .drift import Detokenizer
    from .trajectory import RolloutTrajectories, Trajectory

CHUNK = 64
"""Rollouts assembled per round of queries."""


class _OnLoop:
    """A detokenizer used from the store's read thread, still running on its owner's loop (an
    engine client's HTTP session belongs to the loop that made it)."""

    def __init__(self, inner: Detokenizer, loop: asyncio.AbstractEventLoop) -> None:
        self._inner = inner
        self._loop = loop

    async def detokenize(self, sequences: Sequence[IdArray]) -> list[str]:
        future = asyncio.run_coroutine_threadsafe(self._inner.detokenize(sequences), self._loop)
        return await asyncio.wrap_future(future)


async def build_trajectories(
    store: Store, rollouts: Sequence[RolloutView], *, detokenizer: Detokenizer | None = None
) -> list[RolloutTrajectories]:
    """Several rollouts at once (a few queries for all of them): for exports."""
    if not rollouts:
        return []
    owner = asyncio.get_running_loop()
    detok = None if detokenizer is None else _OnLoop(detokenizer, owner)
    return await store.heavy_read(trajectory.build, rollouts, detok)


async def rollout_trajectories(
    store: Store, rollout_id: str, *, detokenizer: Detokenizer | None = None
) -> RolloutTrajectories:
    """One rollout's segments as trajectories, with its breaks and faithfulness summary."""
    view = await store.rollout(rollout_id)
    return (await build_trajectories(store, [view], detokenizer=detokenizer))[0]


async def trajectories(
    store: Store,
    *,
    batch: str | Sequence[str] | None = None,
    rollouts: str | Sequence[str] | None = None,
    status: str | Sequence[str] | None = None,
    detokenizer: Detokenizer | None = None,
    chunk: int = CHUNK,
) -> AsyncIterator[Trajectory]:
    """Every segment of the selected rollouts as a trajectory, oldest rollout first."""
    ids = [rollouts] if isinstance(rollouts, str) else rollouts
    views = await store.rollouts(batch=batch, status=status, ids=ids, oldest_first=True)
    for start in range(0, len(views), chunk):
        part = views[start : start + chunk]
        for built in await build_trajectories(store, part, detokenizer=detokenizer):
            for t in built.trajectories:
                yield t


async def analyze_rollout(
    store: Store, rollout_id: str, *, detokenizer: Detokenizer | None = None
) -> RolloutTrajectories:
    """Build a rollout's trajectories and record its breaks and faithfulness summary in the
    segment_break and rollout_faithfulness tables (replacing an earlier analysis)."""
    built = await rollout_trajectories(store, rollout_id, detokenizer=detokenizer)
    await store.apply(functools.partial(trajectory.record, built=built))
    return built
