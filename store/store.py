"""The async store: what the proxy and the runner write through and read from."""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar, Unpack

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from . import egress, events, leases, lifecycle, migrate, queries, routed, training, weights
from .database import Database, open_database, unavailable
from .errors import InvalidTokens, ReadOnly
from .filters import FilterKeywords, RolloutFilter
from .flags import HackFlag, as_stored, flags_of
from .ids import hash_key, new_id, new_key
from .packing import RoutingArray, as_ids, as_logprobs
from .read_thread import ReadThread
from .records import (
    BatchView,
    CallBodies,
    CallReceipt,
    CallRecord,
    CallTokens,
    CallView,
    ChoiceRecord,
    CreatedRollout,
    NewRollout,
    RolloutAnalysis,
    RolloutView,
    StoredTurn,
)
from .spill import Spill, folder_for
from .url import DatabaseURL, resolve_url
from .writer import AppendCall, Apply, CreateRollout, GroupCommitWriter, StoreStatus, UpdateRollout

P = ParamSpec("P")
T = TypeVar("T")

FINAL_STATUSES = lifecycle.ENDED
"""The statuses of a rollout that has ended (store/lifecycle.py)."""
_FINAL_VALUES = {s.value for s in FINAL_STATUSES}
_UPDATABLE = {
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
    "key_revoked_at",
    "hack_flags",
}


class Store:
    """Open with `await Store.connect(url)`; close with `await store.close()`."""

    def __init__(self, db: Database, writer: GroupCommitWriter | None) -> None:
        self.db = db
        # None when opened read-only: every write then raises ReadOnly.
        self._writer = writer
        self._read_thread = ReadThread(db.url, read_only=writer is None)
        self._on_finished: list[Callable[[str], None]] = []
        self._on_hack_flags: list[Callable[[str, list[HackFlag]], None]] = []

    @classmethod
    async def connect(
        cls,
        url: str | DatabaseURL | None = None,
        *,
        migrate_: bool = True,
        read_only: bool = False,
        capacity: int = 4096,
        outage_limit: float = 300.0,
        slow_after: float = 5.0,
        spill: Path | None = None,
    ) -> Store:
        """`read_only`: for viewers; nothing is created, migrated or written, and the schema
        must already be the current one. `capacity`: queued writes past which `accepting()` is
        false (the proxy then refuses new calls); `outage_limit`: seconds a write waits for an
        unreachable database before it fails; `slow_after`: seconds a commit may wait before
        `status()` calls the store slow; `spill`: a folder (best on another filesystem) where
        the records of sampled calls whose write outlasted the outage limit are kept, and
        written from once the store is back (store/spill.py), one subfolder per store."""
        resolved = url if isinstance(url, DatabaseURL) else resolve_url(url)
        db = open_database(resolved, read_only=read_only)
        try:
            if read_only:
                await migrate.check_schema(db)
            elif migrate_:
                await migrate.ensure_schema(db)
            else:
                await migrate.current_revision(db)
        except (DBAPIError, OSError) as e:
            await db.dispose()
            raise unavailable(resolved, e) from e
        except BaseException:
            await db.dispose()
            raise
        if read_only:
            return cls(db, None)
        writer = GroupCommitWriter(
            db,
            capacity=capacity,
            outage_limit=outage_limit,
            slow_after=slow_after,
            spill=None if spill is None else Spill(folder_for(spill, resolved.render())),
        )
        writer.start()
        return cls(db, writer)

    async def close(self) -> None:
        await self._read_thread.close()
        if self._writer is not None:
            await self._writer.close()
        await self.db.dispose()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    @property
    def commits(self) -> int:
        return 0 if self._writer is None else self._writer.commits

    def accepting(self) -> bool:
        """Whether the write queue has room for a new call's record."""
        return self._writes().accepting()

    def status(self) -> StoreStatus:
        """ok, or why not: the database unreachable, a commit stuck, the queue full."""
        return self._writes().status()

    def _writes(self) -> GroupCommitWriter:
        if self._writer is None:
            raise ReadOnly("this store was opened read-only")
        return self._writer

    # --- writes (durable when the awaited call returns) ------------------------------------

    async def create_rollout(self, new: NewRollout | None = None) -> CreatedRollout:
        new = new or NewRollout()
        op = CreateRollout(new, new_id(), new.key or new_key())
        result: CreatedRollout = await self._writes().submit(op)
        return result

    async def update_rollout(
        self,
        rollout_id: str,
        *,
        merge_meta: Mapping[str, Any] | None = None,
        append_meta: Mapping[str, Sequence[Any]] | None = None,
        **values: Any,
    ) -> RolloutView:
        """Write a rollout's columns other than its status (which only `report` changes).
        `merge_meta`: keys merged into its metadata in the same transaction; `append_meta`:
        items appended to lists in it. Returns the rollout as the write left it."""
        change = lifecycle.Change(
            merge_meta=dict(merge_meta or {}), append_meta=dict(append_meta or {})
        )
        return await self._write(rollout_id, _checked(values), change)

    async def report(self, rollout_id: str, event: events.Event, **values: Any) -> RolloutView:
        """Report what happened to a rollout (store/events.py); its life decides what that makes
        its status, when the write runs (store/lifecycle.py: an ended rollout's status never
        changes; IllegalTransition). `values`: other columns written with it (hack flags; the
        admin API's reward). Returns the rollout as the write left it (what another writer
        ended it with first, say)."""
        written, change = lifecycle.transition(event, _checked(values), datetime.now(UTC))
        return await self._write(rollout_id, written, change)

    async def _write(
        self, rollout_id: str, values: dict[str, Any], change: lifecycle.Change
    ) -> RolloutView:
        if values.get("hack_flags") is not None:
            values["hack_flags"] = as_stored(values["hack_flags"])
        view: RolloutView = await self._writes().submit(UpdateRollout(rollout_id, values, change))
        if values.get("status") in _FINAL_VALUES:
            for listener in list(self._on_finished):
                listener(rollout_id)
        if values.get("hack_flags"):
            flagged = flags_of(values["hack_flags"]) or []
            for on_flags in list(self._on_hack_flags):
                on_flags(rollout_id, flagged)
        return view

    def on_hack_flags(self, listener: Callable[[str, list[HackFlag]], None]) -> Callable[[], None]:
        """Call `listener(rollout_id, flags)` once flags written through this store are durable
        (the proxy counts them per detector on /metrics); returns the undo."""
        self._on_hack_flags.append(listener)
        return lambda: self._on_hack_flags.remove(listener)

    def on_finished(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Call `listener(rollout_id)` once a final status written through this store is
        durable (the proxy then drops what it caches about the rollout); returns the undo."""
        self._on_finished.append(listener)
        return lambda: self._on_finished.remove(listener)

    async def append_call(self, record: CallRecord) -> CallReceipt:
        """Store one call; returns once it is durable."""
        result: CallReceipt = await self._writes().submit(AppendCall(_validated(record)))
        return result

    async def record_egress(self, records: Sequence[egress.EgressRecord]) -> None:
        """Store what rollouts' sandboxes sent through the egress gate; durable on return."""
        if records:
            await self._writes().submit(
                Apply(functools.partial(egress.insert_records, records=list(records)))
            )

    async def record_metrics(self, record: training.PostedMetrics) -> None:
        """Store figures posted about a batch (store/training.py); durable on return."""
        await self._writes().submit(
            Apply(functools.partial(training.insert_metrics, record=record))
        )

    async def record_weight_checksums(self, record: weights.WeightChecksums) -> None:
        """Store one engine's checksums of a weight version (store/weights.py); durable on
        return."""
        await self._writes().submit(
            Apply(functools.partial(weights.insert_checksums, record=record))
        )

    async def take_lease(
        self, batch_id: str, holder: leases.Holder, gone: Callable[[leases.Lease], bool]
    ) -> leases.Taken:
        """Take the batch's lease for `holder` (store/leases.py `take`); durable on return."""
        taken: leases.Taken = await self._writes().submit(
            Apply(
                functools.partial(
                    leases.take,
                    batch_id=batch_id,
                    holder=holder,
                    now=datetime.now(UTC),
                    gone=gone,
                )
            )
        )
        return taken

    async def beat_lease(self, batch_id: str, token: str) -> bool:
        """Renew the holder's heartbeat; false when the lease is no longer its own."""
        fn = functools.partial(leases.beat, batch_id=batch_id, token=token, now=datetime.now(UTC))
        held: bool = await self._writes().submit(Apply(fn))
        return held

    async def release_lease(self, batch_id: str, token: str) -> None:
        await self._writes().submit(
            Apply(functools.partial(leases.release, batch_id=batch_id, token=token))
        )

    def forget(self, rollout_id: str) -> None:
        """Release the writer's cached state of a rollout that will get no more calls."""
        if self._writer is not None:
            self._writer.forget(rollout_id)

    # --- reads ------------------------------------------------------------------------------

    async def lease(self, batch_id: str) -> leases.Lease | None:
        """Who runs the batch now, as the store last heard (None: nobody)."""
        return await self.db.read(leases.lease_of, batch_id)

    async def rollout(self, rollout_id: str) -> RolloutView:
        return await self.db.read(queries.rollout, rollout_id)

    async def rollout_by_key(self, key: str, *, counted: bool = True) -> RolloutView | None:
        """`counted=False`: without its calls counted (they read 0), a one-row lookup."""
        return await self.db.read(queries.rollout_by_key_hash, hash_key(key), counted=counted)

    async def last_backend(self, rollout_id: str) -> str | None:
        return await self.db.read(queries.last_backend, rollout_id)

    async def idle_unbatched(self, idle_seconds: float) -> list[str]:
        """Unfinished rollouts outside any batch with no call for `idle_seconds` (queries.py)."""
        cutoff = datetime.now(UTC) - timedelta(seconds=idle_seconds)
        return await self.db.read(queries.idle_unbatched, cutoff)

    async def weight_checksums(
        self, weight_version: str | None = None
    ) -> list[weights.WeightChecksums]:
        """The engines' checksums of `weight_version` (of every version when None)."""
        return await self.db.read(weights.checksums_of, weight_version)

    async def first_weight_version(self, rollout_id: str) -> str | None:
        return await self.db.read(queries.first_weight_version, rollout_id)

    async def rollouts(
        self, where: RolloutFilter | None = None, /, **keywords: Unpack[FilterKeywords]
    ) -> list[RolloutView]:
        """Rollouts matching every filter given, newest first: `where`, or its fields as
        keywords (`batch=`, `status=`, ...; store/filters.py)."""
        return await self.db.read(queries.rollouts, RolloutFilter.of(where, **keywords))

    async def analyses(self, rollout_ids: Sequence[str]) -> dict[str, RolloutAnalysis]:
        """The stored faithfulness summaries of these rollouts (finished ones have one)."""
        return await self.db.read(queries.analyses, rollout_ids)

    async def batches(
        self, *, pass_reward: float = 1.0, limit: int | None = None, offset: int = 0
    ) -> list[BatchView]:
        return await self.db.read(
            queries.batches, pass_reward=pass_reward, limit=limit, offset=offset
        )

    async def calls(self, rollout_id: str) -> list[CallView]:
        return await self.db.read(queries.calls, rollout_id)

    async def egress(self, rollout_id: str) -> list[egress.EgressRecord]:
        """The rollout's egress requests, oldest first (empty without egress)."""
        return await self.db.read(egress.records_of, rollout_id)

    async def call(self, call_id: str) -> CallView:
        return await self.db.read(queries.call, call_id)

    async def call_tokens(self, call_id: str) -> CallTokens:
        return await self.db.read(queries.call_tokens, call_id)

    async def rollout_tokens(self, rollout_id: str) -> dict[str, CallTokens]:
        return await self.db.read(queries.rollout_tokens, rollout_id)

    async def routed_experts(self, rollout_id: str) -> dict[tuple[str, int], RoutingArray]:
        """(call id, choice) -> the routed experts its engine sent (store/routed.py)."""
        return await self.db.read(routed.rollout_routing, rollout_id)

    async def lineage_turns(self, rollout_id: str, request: bytes) -> list[StoredTurn]:
        """The rollout's token-in calls that answered the messages hashed as `request`."""
        return await self.db.read(queries.lineage_turns, rollout_id, request)

    async def call_bodies(self, call_id: str) -> CallBodies:
        return await self.db.read(queries.call_bodies, call_id)

    async def rollout_bodies(
        self, rollout_id: str, *, engine_requests: bool = False
    ) -> dict[str, CallBodies]:
        """Every call's recorded bodies, by call id, in one read."""
        return await self.db.read(
            queries.rollout_bodies, rollout_id, engine_requests=engine_requests
        )

    async def latest_call_with_body(
        self, rollout_id: str, body_hash: str
    ) -> tuple[str, str] | None:
        return await self.db.read(queries.latest_call_with_body, rollout_id, body_hash)

    async def heavy_read(
        self,
        fn: Callable[Concatenate[Database, P], Coroutine[Any, Any, T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """`fn(db, ...)`, a read of seconds of CPU (trajectory assembly), on the store's read
        thread with its own connections (store/read_thread.py): the caller's loop runs on."""
        return await self._read_thread.run(fn, *args, **kwargs)

    async def apply(self, fn: Callable[[Connection], Any]) -> None:
        """Run a write function in the writer's transaction (writer.Apply: it must be
        idempotent); durable on return."""
        await self._writes().submit(Apply(fn))


def _validated(record: CallRecord) -> CallRecord:
    """Refuse bad token data before it is queued, so the caller gets the error, not the batch."""
    # Fixed before the first attempt: a retried batch looks its calls up by id.
    record.call_id = record.call_id or new_id()
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
    for index, array in record.routed_experts.items():
        if index not in seen:
            raise InvalidTokens(f"routed experts for choice {index}, which the call does not have")
        if array.ndim not in (2, 3) or array.dtype.name not in routed.DTYPES:
            raise InvalidTokens(f"routed experts of shape {array.shape} and dtype {array.dtype}")
    return record


def _checked(values: dict[str, Any]) -> dict[str, Any]:
    if "status" in values:
        raise TypeError("a rollout's status changes by Store.report(rollout_id, event) alone")
    unknown = set(values) - _UPDATABLE
    if unknown:
        raise TypeError(f"cannot update rollout fields {sorted(unknown)}")
    return values
