"""Which rollouts a listing returns: the one `RolloutFilter` the store, the blocking reader and
`rolltap ls` all read (listing.py turns it into SQL)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict, Unpack


@dataclass(frozen=True)
class RolloutFilter:
    """Every filter given must hold; then the order and the page. None: not filtered on."""

    batch: str | Sequence[str] | None = None
    """A batch id, or several."""
    status: str | Sequence[str] | None = None
    """A status (listing accepts a few words for them), or several."""
    ids: Sequence[str] | None = None
    task: str | None = None
    harness: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    drift: str | None = None
    """Reads the stored analysis (a rollout is analysed when it finishes): one of
    listing.DRIFT_FILTERS."""
    hack: str | None = None
    """Reads the stored hack flags: one of listing.HACK_FILTERS, or a detector's name (flagged
    by it)."""
    limit: int | None = None
    offset: int = 0
    oldest_first: bool = False
    """Oldest first; newest first by default."""

    @classmethod
    def of(
        cls, where: RolloutFilter | None = None, **keywords: Unpack[FilterKeywords]
    ) -> RolloutFilter:
        """`where` with the keywords a caller gave in its place or on top of it (`batch=...`,
        `status=...`: the keyword form of every method that lists rollouts); an unknown keyword
        is a TypeError, as for a method's own parameters."""
        if where is None:
            return cls(**keywords)
        return dataclasses.replace(where, **keywords) if keywords else where


class FilterKeywords(TypedDict, total=False):
    """RolloutFilter's fields as keywords (`rollouts(batch=..., status=...)`), so the type
    checker reads a listing's keywords as it reads the dataclass (a test holds the two alike)."""

    batch: str | Sequence[str] | None
    status: str | Sequence[str] | None
    ids: Sequence[str] | None
    task: str | None
    harness: str | None
    min_reward: float | None
    max_reward: float | None
    drift: str | None
    hack: str | None
    limit: int | None
    offset: int
    oldest_first: bool
