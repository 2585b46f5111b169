"""The async store: what the proxy and the runner write through and read from."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.exc import DBAPIError

from rolltap.store import migrate, queries, trajectory
from rolltap.store.database import Database, open_database, unavailable
from rolltap.store.drift import Detokenizer
from rolltap.store.errors import InvalidTokens
from rolltap.store.ids import hash_key
from rolltap.store.models import RolloutStatus
from rolltap.store.packing import as_ids, as_logprobs
from rolltap.store.records import (
    CallBodies,
    CallReceipt,
    CallRecord,
    CallTokens,
    CallView,
    ChoiceRecord,
    CreatedRollout,
    NewRollout,
    RolloutView,
)
from rolltap.store.trajectory import RolloutTrajectories, Trajectory
from rolltap.store.url import DatabaseURL, resolve_url
from rolltap.store.writer import (
    AppendCall,
    Apply,
    CreateRollout,
    GroupCommitWriter,
    UpdateRollout,
)

FINAL_STATUSES = {
    RolloutStatus.SUCCEEDED,
    RolloutStatus.FAILED,
    RolloutStatus.TIMED_OUT,
    RolloutStatus.CANCELLED,
    RolloutStatus.BUDGET_EXCEEDED,
}
_UPDATABLE = {
    "status",
    "reward",
    "reward_details",
    "error",
    "started_at",
    "finished_at",
    "meta",
    "harness",
    "model",
    "max_calls",
    "max_tokens",
}


class Store:
    """Open with `await Store.connect(url)`; close with `await store.close()`."""

    def __init__(self, db: Database, writer: GroupCommitWriter) -> None:
        self.db = db
        self._writer = writer

    @classmethod
    async def connect(cls, url: str | DatabaseURL | None = None, *, migrate_: bool = True) -> Store:
        resolved = url if isinstance(url, DatabaseURL) else resolve_url(url)
        db = open_database(resolved)
        try:
            if migrate_:
                await migrate.ensure_schema(db)
            else:
                await migrate.current_revision(db)
        except (DBAPIError, OSError) as e:
            await db.dispose()
            raise unavailable(resolved, e) from e
        except BaseException:
            await db.dispose()
            raise
        writer = GroupCommitWriter(db)
        writer.start()
        return cls(db, writer)

    async def close(self) -> None:
        await self._writer.close()
        await self.db.dispose()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    @property
    def commits(self) -> int:
        return self._writer.commits

    # --- writes (durable when the awaited call returns) ------------------------------------

    async def create_rollout(self, new: NewRollout | None = None) -> CreatedRollout:
        result: CreatedRollout = await self._writer.submit(CreateRollout(new or NewRollout()))
        return result

    async def update_rollout(self, rollout_id: str, **values: Any) -> None:
        unknown = set(values) - _UPDATABLE
        if unknown:
            raise TypeError(f"cannot update rollout fields {sorted(unknown)}")
        if "status" in values:
            status = RolloutStatus(values["status"])
            values["status"] = status.value
            now = datetime.now(UTC)
            if status is RolloutStatus.RUNNING:
                values.setdefault("started_at", now)
            if status in FINAL_STATUSES:
                values.setdefault("finished_at", now)
        await self._writer.submit(UpdateRollout(rollout_id, values))

    async def append_call(self, record: CallRecord) -> CallReceipt:
        """Store one call; returns once it is durable."""
        result: CallReceipt = await self._writer.submit(AppendCall(_validated(record)))
        return result

    def forget(self, rollout_id: str) -> None:
        """Release the writer's cached state of a rollout that will get no more calls."""
        self._writer.forget(rollout_id)

    # --- reads ------------------------------------------------------------------------------

    async def rollout(self, rollout_id: str) -> RolloutView:
        return await self.db.read(queries.rollout, rollout_id)

    async def rollout_by_key(self, key: str) -> RolloutView | None:
        return await self.db.read(queries.rollout_by_key_hash, hash_key(key))

    async def rollouts(
        self,
        *,
        batch: str | Sequence[str] | None = None,
        status: str | Sequence[str] | None = None,
        ids: Sequence[str] | None = None,
        limit: int | None = None,
        oldest_first: bool = False,
    ) -> list[RolloutView]:
        return await self.db.read(
            queries.rollouts,
            batch=batch,
            status=status,
            ids=ids,
            limit=limit,
            oldest_first=oldest_first,
        )

    async def calls(self, rollout_id: str) -> list[CallView]:
        return await self.db.read(queries.calls, rollout_id)

    async def call(self, call_id: str) -> CallView:
        return await self.db.read(queries.call, call_id)

    async def call_tokens(self, call_id: str) -> CallTokens:
        return await self.db.read(queries.call_tokens, call_id)

    async def rollout_tokens(self, rollout_id: str) -> dict[str, CallTokens]:
        return await self.db.read(queries.rollout_tokens, rollout_id)

    async def call_bodies(self, call_id: str) -> CallBodies:
        return await self.db.read(queries.call_bodies, call_id)

    async def latest_call_with_body(
        self, rollout_id: str, body_hash: str
    ) -> tuple[str, str] | None:
        return await self.db.read(queries.latest_call_with_body, rollout_id, body_hash)

    # --- trajectories (see rolltap.store.trajectory) -----------------------------------------

    async def rollout_trajectories(
        self, rollout_id: str, *, detokenizer: Detokenizer | None = None
    ) -> RolloutTrajectories:
        """One rollout's segments as trajectories, with its breaks and faithfulness summary."""
        view = await self.rollout(rollout_id)
        return (await trajectory.build(self.db, [view], detokenizer))[0]

    async def build_trajectories(
        self, rollouts: Sequence[RolloutView], *, detokenizer: Detokenizer | None = None
    ) -> list[RolloutTrajectories]:
        """Several rollouts at once (a few queries for all of them): for exports."""
        return await trajectory.build(self.db, rollouts, detokenizer)

    async def trajectories(
        self,
        *,
        batch: str | Sequence[str] | None = None,
        rollouts: str | Sequence[str] | None = None,
        status: str | Sequence[str] | None = None,
        detokenizer: Detokenizer | None = None,
        chunk: int = trajectory.CHUNK,
    ) -> AsyncIterator[Trajectory]:
        """Every segment of the selected rollouts as a trajectory, oldest rollout first."""
        views = await self.rollouts(
            batch=batch, status=status, ids=_ids(rollouts), oldest_first=True
        )
        for start in range(0, len(views), chunk):
            for built in await trajectory.build(self.db, views[start : start + chunk], detokenizer):
                for t in built.trajectories:
                    yield t

    async def analyze_rollout(
        self, rollout_id: str, *, detokenizer: Detokenizer | None = None
    ) -> RolloutTrajectories:
        """Build a rollout's trajectories and record its breaks and faithfulness summary in the
        segment_break and rollout_faithfulness tables (replacing an earlier analysis)."""
        built = await self.rollout_trajectories(rollout_id, detokenizer=detokenizer)
        await self._writer.submit(Apply(functools.partial(trajectory.record, built=built)))
        return built


def _ids(rollouts: str | Sequence[str] | None) -> Sequence[str] | None:
    return [rollouts] if isinstance(rollouts, str) else rollouts


def _validated(record: CallRecord) -> CallRecord:
    """Refuse bad token data before it is queued, so the caller gets the error, not the batch."""
    if record.prompt_ids is not None:
        record.prompt_ids = as_ids(record.prompt_ids)
    seen: set[int] = set()
    checked: list[ChoiceRecord] = []
    for choice in record.choices:
        if choice.index in seen:
            raise InvalidTokens(f"choice index {choice.index} appears twice")
        seen.add(choice.index)
        ids = as_ids(choice.token_ids)
        logprobs = None if choice.logprobs is None else as_logprobs(choice.logprobs)
        if logprobs is not None and len(logprobs) != len(ids):
            raise InvalidTokens(
                f"choice {choice.index}: {len(logprobs)} logprobs for {len(ids)} token ids"
            )
        checked.append(ChoiceRecord(choice.index, ids, logprobs, choice.finish_reason))
    record.choices = checked
    return record
