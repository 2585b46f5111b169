"""A blocking reader for trainers and scripts: `rolltap.store.open(url)`.

It drives the async store on a private event loop thread, so it also works inside a notebook or
a trainer that already runs an event loop of its own. What reads a record takes the reader as its
store: trajectories (rolltap.analysis.reader), or any coroutine of analysis/ and audit/ through
`run` (`reader.run(verify_rollout(reader.store, rollout_id))`).
"""

from __future__ import annotations

import os
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar, Unpack

from ..loop_thread import LoopThread
from .egress import EgressRecord
from .filters import FilterKeywords, RolloutFilter
from .lookup import Kind, resolve_id
from .records import BatchView, CallBodies, CallTokens, CallView, RolloutAnalysis, RolloutView
from .store import Store
from .url import DatabaseURL

T = TypeVar("T")


class StoreReader:
    def __init__(self, url: str | DatabaseURL | None = None, *, read_only: bool = False) -> None:
        self._loop = LoopThread("rolltap-store")
        try:
            self._store = self._loop.run(Store.connect(url, read_only=read_only))
        except BaseException:
            self._loop.stop()
            raise

    @property
    def store(self) -> Store:
        """The async store underneath, for code that runs on this reader's loop."""
        return self._store

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine of the async store on this reader's loop and wait for it."""
        return self._loop.run(coro)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Start a coroutine of the async store on this reader's loop and return at once."""
        return self._loop.submit(coro)

    def close(self) -> None:
        try:
            self._loop.run(self._store.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def rollouts(
        self, where: RolloutFilter | None = None, /, **keywords: Unpack[FilterKeywords]
    ) -> list[RolloutView]:
        """Rollouts matching every filter given, newest first (see `Store.rollouts`)."""
        return self.run(self._store.rollouts(where, **keywords))

    def analyses(self, rollout_ids: Sequence[str]) -> dict[str, RolloutAnalysis]:
        return self.run(self._store.analyses(rollout_ids))

    def batches(
        self, *, pass_reward: float = 1.0, limit: int | None = None, offset: int = 0
    ) -> list[BatchView]:
        return self.run(self._store.batches(pass_reward=pass_reward, limit=limit, offset=offset))

    def resolve(self, kind: Kind, given: str) -> str:
        """The rollout, batch or call id that `given` is or uniquely begins (store/lookup.py)."""
        return self.run(self._store.db.read(resolve_id, kind, given))

    def rollout(self, rollout_id: str) -> RolloutView:
        return self.run(self._store.rollout(rollout_id))

    def calls(self, rollout_id: str) -> list[CallView]:
        return self.run(self._store.calls(rollout_id))

    def call(self, call_id: str) -> CallView:
        return self.run(self._store.call(call_id))

    def egress(self, rollout_id: str) -> list[EgressRecord]:
        return self.run(self._store.egress(rollout_id))

    def call_tokens(self, call_id: str) -> CallTokens:
        return self.run(self._store.call_tokens(call_id))

    def rollout_tokens(self, rollout_id: str) -> dict[str, CallTokens]:
        return self.run(self._store.rollout_tokens(rollout_id))

    def call_bodies(self, call_id: str) -> CallBodies:
        return self.run(self._store.call_bodies(call_id))


def open(url: str | DatabaseURL | None = None, *, read_only: bool = False) -> StoreReader:
    """Open the store at `url` (default: ROLLTAP_DB, else the embedded SQLite file).
    `read_only`: create, migrate and write nothing (the schema must be current)."""
    return StoreReader(
        url if url is not None else os.environ.get("ROLLTAP_DB"), read_only=read_only
    )
