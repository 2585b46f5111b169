"""Trajectories read through the blocking reader (`rolltap.store.open`), for trainers and
scripts:

    import rolltap.store
    from rolltap.analysis.reader import trajectories
    with rolltap.store.open("postgresql+asyncpg://rl@db/rolltap") as store:
        for t in trajectories(store, batch="step-12", status="finished"): ...

The reader's loop drives the async store; assembly runs on the store's read thread
(analysis/reading.py), so the next part is built while the caller takes this one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

from . import reading
from .reading import CHUNK

if TYPE_CHECKING:
    from ..store.reader import StoreReader
    from ..store.records import RolloutView
    from .drift import Detokenizer
    from .trajectory import RolloutTrajectories, Trajectory


def trajectories(
    reader: StoreReader,
    *,
    batch: str | Sequence[str] | None = None,
    rollouts: str | Sequence[str] | None = None,
    status: str | Sequence[str] | None = None,
    detokenizer: Detokenizer | None = None,
) -> Iterator[Trajectory]:
    """Every segment of the selected rollouts as a trajectory (numpy arrays), oldest first."""
    for built in iter_rollout_trajectories(
        reader, batch=batch, rollouts=rollouts, status=status, detokenizer=detokenizer
    ):
        yield from built.trajectories


def iter_rollout_trajectories(
    reader: StoreReader,
    *,
    batch: str | Sequence[str] | None = None,
    rollouts: str | Sequence[str] | None = None,
    status: str | Sequence[str] | None = None,
    detokenizer: Detokenizer | None = None,
    chunk: int = CHUNK,
) -> Iterator[RolloutTrajectories]:
    """Rollout by rollout, with each one's breaks and faithfulness summary."""
    ids = [rollouts] if isinstance(rollouts, str) else rollouts
    views = reader.rollouts(batch=batch, status=status, ids=ids, oldest_first=True)
    parts = [views[start : start + chunk] for start in range(0, len(views), chunk)]

    def build(part: list[RolloutView]) -> Future[list[RolloutTrajectories]]:
        return reader.submit(
            reading.build_trajectories(reader.store, part, detokenizer=detokenizer)
        )

    # The next part is built while the caller takes this one (an export writes Parquet
    # without the GIL meanwhile), so assembly, the database and the writer overlap.
    pending: deque[Future[list[RolloutTrajectories]]] = deque()
    try:
        for part in parts:
            pending.append(build(part))
            if len(pending) > 1:
                yield from pending.popleft().result()
        while pending:
            yield from pending.popleft().result()
    finally:
        for left in pending:
            left.cancel()


def rollout_trajectories(
    reader: StoreReader, rollout_id: str, *, detokenizer: Detokenizer | None = None
) -> RolloutTrajectories:
    return reader.run(
        reading.rollout_trajectories(reader.store, rollout_id, detokenizer=detokenizer)
    )


def analyze_rollout(
    reader: StoreReader, rollout_id: str, *, detokenizer: Detokenizer | None = None
) -> RolloutTrajectories:
    return reader.run(reading.analyze_rollout(reader.store, rollout_id, detokenizer=detokenizer))
