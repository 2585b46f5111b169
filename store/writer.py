"""Group commit: one task turns every queued write into one transaction, one fsync per batch.

Callers get a future per write that resolves once its transaction committed, so a proxy can hold
a response's last byte until its record is durable, while a thousand calls per second cost a few
dozen commits.

When the database is away (store/outage.py), the whole batch is retried with backoff until it
commits or its oldest write has waited `outage_limit` seconds; a retry first looks up which of its
writes a lost-acknowledgement attempt already committed, so nothing is written twice. A batch that
fails for any other reason is split in halves until the bad write fails alone.

The queue is bounded softly: `accepting()` turns false once `capacity` writes wait, and the proxy
then refuses new calls at intake; writes of calls already under way are always queued (their
tokens were sampled), so the queue peaks at `capacity` plus the calls in flight when it filled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from operator import itemgetter
from pathlib import Path
from typing import Any

from sqlalchemy import Table, insert, select, text, update
from sqlalchemy.engine import Connection, Dialect
from tenacity import AsyncRetrying, retry_if_exception, wait_exponential_jitter

from . import chain, compress, lifecycle, queries, routed
from .checkpoint import WalCheckpointer
from .database import BUSY_TIMEOUT_MS, Database
from .delta import KnownCall, RecentCalls, choose_parent
from .errors import DatabaseUnavailable, NotFound, WriterClosed
from .ids import hash_key, new_id
from .models import (
    RolloutStatus,
    UTCDateTime,
    call_body_table,
    call_table,
    choice_table,
    lineage_turn_table,
    rollout_table,
    routed_experts_table,
)
from .outage import describe, is_full, is_outage
from .packing import pack
from .records import CallReceipt, CallRecord, CreatedRollout, NewRollout, RolloutView
from .revision import VERSION_TABLE
from .spill import Spill

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AppendCall:
    record: CallRecord
    """Its call_id is set before the first attempt, so a retry can tell whether it committed."""


@dataclass(frozen=True)
class CreateRollout:
    new: NewRollout
    rollout_id: str
    key: str


@dataclass(frozen=True)
class UpdateRollout:
    rollout_id: str
    values: dict[str, Any]
    change: lifecycle.Change = field(default_factory=lifecycle.Change)
    """What the write asks of the rollout's life, resolved against the stored row when it runs
    (store/lifecycle.py)."""


@dataclass(frozen=True)
class Apply:
    """Any other write: a function run inside the batch's transaction, on the one writer.

    It must be idempotent: after a lost acknowledgement it runs again."""

    fn: Callable[[Connection], Any]


Op = AppendCall | CreateRollout | UpdateRollout | Apply


@dataclass
class _Pending:
    op: Op
    future: asyncio.Future[Any]
    submitted: float
    """time.monotonic() at submit: a write waits out an outage for at most outage_limit."""
    settled: bool = False


@dataclass
class _Staged:
    """What a transaction added, merged into the writer's caches only once it committed."""

    next_seq: dict[str, int] = field(default_factory=dict)
    prev_hash: dict[str, bytes] = field(default_factory=dict)
    """The hash each rollout's next call chains to (chain.py)."""
    known: dict[str, list[KnownCall]] = field(default_factory=dict)
    calls: list[dict[str, Any]] = field(default_factory=list)
    choices: list[dict[str, Any]] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    lineages: list[dict[str, Any]] = field(default_factory=list)
    routed: list[dict[str, Any]] = field(default_factory=list)
    routed_latest: dict[str, dict[int, tuple[str, Any]]] = field(default_factory=dict)
    """Each rollout's latest routed call of this batch (store/routed.py), cached on commit."""


class StoreState(StrEnum):
    OK = "ok"
    DOWN = "down"
    """The last attempt found the database unreachable; writes wait and are retried."""
    SLOW = "slow"
    """A commit has been waiting longer than slow_after (e.g. a SQLite file locked by another
    process)."""
    BACKLOG = "backlog"
    """capacity writes are queued: new calls are refused until the queue drains."""
    FULL = "full"
    """The database's disk is full: new calls are refused until a write goes through again;
    the writes of calls already sampled wait (up to outage_limit) and are retried."""


@dataclass(frozen=True)
class StoreStatus:
    state: StoreState
    reason: str | None
    queued: int
    capacity: int

    @property
    def accepting(self) -> bool:
        return self.queued < self.capacity and self.state is not StoreState.FULL


_STOP = object()
PROBE_S = 1.0
"""How often a store that is away, with no write queued, is probed for writes."""
ROOM_TO_RESUME = 4 << 20
"""Free bytes a SQLite store's filesystem needs before a full store takes calls again."""


class GroupCommitWriter:
    def __init__(
        self,
        db: Database,
        *,
        max_batch: int = 512,
        capacity: int = 4096,
        outage_limit: float = 300.0,
        slow_after: float = 5.0,
        recent: RecentCalls | None = None,
        spill: Spill | None = None,
    ):
        self._db = db
        self._spill = spill
        """Where the records of sampled calls go when a write outlasts outage_limit."""
        self._unspilling: asyncio.Task[None] | None = None
        self._max_batch = max_batch
        self._capacity = capacity
        self._outage_limit = outage_limit
        self._slow_after = slow_after
        self._recent = recent or RecentCalls()
        self._routed = routed.RecentRouting()
        self._inserts = _Inserts()
        self._queue: asyncio.Queue[_Pending | object] = asyncio.Queue()
        self._queued = 0
        """Writes submitted and not yet settled (queued or in the batch being committed)."""
        self._down_since: float | None = None
        self._full = False
        """The outage under way is a full disk (store/outage.py is_full)."""
        self._attempt_since: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        # SQLite: all batches run on one thread with the writer's own connection, and WAL
        # checkpoints on another, so no commit waits for one.
        self._thread: ThreadPoolExecutor | None = None
        self._thread_conn: Connection | None = None
        """The writer thread's own connection (SQLite), opened on its first batch."""
        self._checkpointer: WalCheckpointer | None = None
        if db.sync_writer is not None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="rolltap-writer")
            self._checkpointer = WalCheckpointer(db.url.sqlite_path, BUSY_TIMEOUT_MS)
        self.commits = 0
        """Transactions committed so far (the benchmark reports writes per commit)."""

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="rolltap-writer")
        if self._checkpointer is not None:
            self._checkpointer.start()
        # What a process before this one spilled and never wrote.
        self._unspill()

    async def close(self) -> None:
        """Commit everything already submitted, then stop."""
        if self._closed:
            return
        if self._unspilling is not None:
            # Its writes go through the loop that _STOP ends.
            with contextlib.suppress(Exception):
                await self._unspilling
        self._closed = True
        self._queue.put_nowait(_STOP)
        if self._task is not None:
            await self._task
        if self._thread is not None:
            self._thread.submit(self._release_thread_conn)
            self._thread.shutdown(wait=True)
        if self._checkpointer is not None:
            await asyncio.to_thread(self._checkpointer.close)

    def submit(self, op: Op) -> asyncio.Future[Any]:
        """Queue a write; never refused for a full queue (see accepting())."""
        if self._closed:
            raise WriterClosed("the store is closed")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queued += 1
        self._queue.put_nowait(_Pending(op, future, time.monotonic()))
        return future

    def accepting(self) -> bool:
        """Whether a new call may be sampled: the queue has room for its writes, and the disk
        is not full (its answer would wait for a record that cannot be written)."""
        return self._queued < self._capacity and not (self._full and self._down_since is not None)

    def status(self) -> StoreStatus:
        now = time.monotonic()
        state, reason = StoreState.OK, None
        if self._down_since is not None and self._full:
            state = StoreState.FULL
            reason = (
                f"the database's disk has been full for {now - self._down_since:.0f} s; "
                f"{self._queued} writes waiting"
            )
        elif self._down_since is not None:
            state = StoreState.DOWN
            # No driver text here: /health is open, also to sandboxes; the log has the detail.
            reason = (
                f"database unreachable for {now - self._down_since:.0f} s; "
                f"{self._queued} writes waiting"
            )
        elif self._attempt_since is not None and now - self._attempt_since > self._slow_after:
            state = StoreState.SLOW
            reason = f"a commit has waited {now - self._attempt_since:.0f} s"
        elif self._queued >= self._capacity:
            state = StoreState.BACKLOG
            reason = f"{self._queued} writes queued (capacity {self._capacity})"
        return StoreStatus(state, reason, self._queued, self._capacity)

    async def _next(self) -> _Pending | object:
        """The next queued write. While the store is away with nothing queued, probe it every
        PROBE_S: a full disk refuses every new call, so no write of theirs would ever find out
        that space came back, and the store would stay refused for good."""
        while True:
            if self._down_since is None or not self._queue.empty():
                return await self._queue.get()
            try:
                return await asyncio.wait_for(self._queue.get(), timeout=PROBE_S)
            except TimeoutError:
                await self._probe()

    async def _probe(self) -> None:
        if self._full and self._thread is not None and not _has_room(self._db.url.sqlite_path):
            # SQLite's WAL keeps the space it grew to, so a small write can go through on a
            # disk that is still full; the calls let in would then wait for their records.
            return
        probe = _Pending(Apply(_touch), asyncio.get_running_loop().create_future(), 0.0)
        try:
            await self._transaction([probe], retry=False)
        except Exception as e:
            if is_outage(e):
                self._went_down(e)
            else:
                log.debug("store probe failed: %r", e)
            return
        self._back_up()

    async def _run(self) -> None:
        stopping = False
        while not stopping:
            item = await self._next()
            if item is _STOP:
                break
            batch = [item]
            while len(batch) < self._max_batch and not self._queue.empty():
                more = self._queue.get_nowait()
                if more is _STOP:
                    stopping = True
                    break
                batch.append(more)
            pending = [p for p in batch if isinstance(p, _Pending)]
            try:
                await self._commit(pending)
            except Exception as e:  # a bug here must not stop every later write
                log.exception("store writer failed on a batch")
                for p in pending:
                    self._settle(p, error=e)

    async def _commit(self, batch: list[_Pending]) -> None:
        try:
            results = await self._waiting_out_outages(batch)
        except Exception as e:
            if is_outage(e):
                kept = self._spilled(batch)
                error = DatabaseUnavailable(
                    f"the store was unreachable for {self._outage_limit:.0f} s: {describe(e)}"
                    + ("" if kept is None else f"; the call's record is kept in {kept}")
                )
                for pending in batch:
                    self._settle(pending, error=error)
                return
            if len(batch) > 1:
                # Halve until the bad write fails alone; the others commit.
                middle = len(batch) // 2
                await self._commit(batch[:middle])
                await self._commit(batch[middle:])
                return
            log.debug("store write failed: %r", e)
            self._settle(batch[0], error=e)
            return
        for pending, result in zip(batch, results, strict=True):
            self._settle(pending, result)

    def _spilled(self, batch: list[_Pending]) -> Path | None:
        """The records of sampled calls in a batch that outlasted the outage limit, kept in the
        spill to be written once the store is back; None without a spill or any record."""
        records = [p.op.record for p in batch if isinstance(p.op, AppendCall)]
        if self._spill is None or not records:
            return None
        try:
            kept = self._spill.keep(records)
        except OSError as e:
            log.error("could not spill %d call records: %s", len(records), e)
            return None
        log.warning(
            "store away past its outage limit: %d call records kept in %s", len(records), kept
        )
        return kept

    def _unspill(self) -> None:
        """Once writes go through again, write what the spill holds (on its own task: the
        writer's loop must stay free to commit them)."""
        if self._spill is None or self._closed:
            return
        if self._unspilling is not None and not self._unspilling.done():
            return
        if next(self._spill.files(), None) is None:
            return
        self._unspilling = asyncio.get_running_loop().create_task(
            self._write_spilled(self._spill), name="rolltap-unspill"
        )

    async def _write_spilled(self, spill: Spill) -> None:
        for path in list(spill.files()):
            try:
                records = spill.load(path)
                await asyncio.gather(*(self.submit(AppendCall(r)) for r in records))
            except Exception as e:  # kept for the next recovery, or for a person to read
                log.warning("spilled records in %s not written yet: %s", path, describe(e))
                return
            spill.written(path)
            log.warning("%d spilled call records written to the store from %s", len(records), path)

    def _settle(
        self, pending: _Pending, result: Any = None, error: BaseException | None = None
    ) -> None:
        if pending.settled:
            return
        pending.settled = True
        self._queued -= 1
        if pending.future.done():  # its caller stopped waiting; the write stands regardless
            return
        if error is not None:
            pending.future.set_exception(error)
        else:
            pending.future.set_result(result)

    async def _waiting_out_outages(self, batch: list[_Pending]) -> list[Any]:
        """The batch's transaction, retried whole with backoff while the database is away."""
        try:
            # Bare first: tenacity's bookkeeping on the loop costs a lone call a tenth of a
            # millisecond, more than its SQLite commit.
            results = await self._transaction(batch, retry=False)
        except Exception as e:
            if not is_outage(e):
                raise
            self._went_down(e)
        else:
            self._back_up()
            return results
        oldest = min(p.submitted for p in batch)

        async def attempt() -> list[Any]:
            try:
                return await self._transaction(batch, retry=True)
            except Exception as e:
                if is_outage(e):
                    self._went_down(e)  # an outage may turn into a full disk, or back
                raise

        retrying = AsyncRetrying(
            retry=retry_if_exception(is_outage),
            wait=wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.1),
            stop=lambda _: time.monotonic() - oldest >= self._outage_limit,
            reraise=True,
        )
        results = await retrying(attempt)
        self._back_up()
        return results

    def _back_up(self) -> None:
        if self._down_since is not None:
            log.warning(
                "store reachable again after %.1f s; %d writes waiting",
                time.monotonic() - self._down_since,
                self._queued,
            )
            self._down_since = None
            self._unspill()
            if self._full and self._checkpointer is not None:
                # What the full disk left in the WAL goes into the database, and the WAL file
                # gives its space back.
                self._checkpointer.recovered()
            self._full = False

    def _went_down(self, error: BaseException) -> None:
        full = is_full(error)
        if self._down_since is None:
            self._down_since = time.monotonic()
            if full:
                log.warning(
                    "store disk full (%s): new calls are refused; writes of calls under way "
                    "wait and are retried",
                    describe(error),
                )
            else:
                log.warning("store unreachable (%s): writes wait and are retried", describe(error))
        self._full = full

    async def _transaction(self, batch: list[_Pending], *, retry: bool) -> list[Any]:
        ops = [p.op for p in batch]
        self._attempt_since = time.monotonic()
        try:
            if self._thread is not None:
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(
                    self._thread, self._transaction_in_thread, ops, retry
                )
            async with self._db.writer.begin() as conn:
                results, staged = await conn.run_sync(self._apply, ops, retry)
            self._committed(staged)
            return results
        finally:
            self._attempt_since = None

    def _transaction_in_thread(self, ops: list[Op], retry: bool) -> list[Any]:
        assert self._db.sync_writer is not None
        # The thread keeps its connection between batches: a pool checkout and the reset on
        # return cost a lone call as much as its commit.
        if self._thread_conn is None:
            self._thread_conn = self._db.sync_writer.connect()
        conn = self._thread_conn
        try:
            with conn.begin():
                results, staged = self._apply(conn, ops, retry)
        except BaseException:
            self._release_thread_conn()
            raise
        self._committed(staged)
        return results

    def _release_thread_conn(self) -> None:
        if self._thread_conn is not None:
            conn, self._thread_conn = self._thread_conn, None
            conn.close()

    def _committed(self, staged: _Staged) -> None:
        self.commits += 1
        if self._checkpointer is not None:
            self._checkpointer.committed()
        for rollout_id, known in staged.known.items():
            for k in known:
                self._recent.add(rollout_id, k)
        for rollout_id, choices in staged.routed_latest.items():
            self._routed.put(rollout_id, choices)

    def _apply(
        self, conn: Connection, ops: list[Op], retry: bool = False
    ) -> tuple[list[Any], _Staged]:
        """The batch as statements on one connection, inside the caller's transaction.

        This is the one place where a batch becomes a transaction. On a `retry` (the previous
        attempt lost its connection, perhaps after its COMMIT went through) the calls and
        rollouts that attempt already wrote are answered from the database, not written again.
        """
        staged = _Staged()
        results: list[Any] = []
        written_calls: dict[str, CallReceipt] = {}
        written_rollouts: set[str] = set()
        if retry:
            written_calls = queries.call_receipts(
                conn, [op.record.call_id for op in ops if isinstance(op, AppendCall)]
            )
            written_rollouts = queries.existing_rollouts(
                conn, [op.rollout_id for op in ops if isinstance(op, CreateRollout)]
            )
        appended = {op.record.rollout_id for op in ops if isinstance(op, AppendCall)}
        if appended:
            ends = queries.lock_chain_ends(conn, sorted(appended))
            staged.next_seq = {rid: end.next_seq for rid, end in ends.items()}
            staged.prev_hash = {rid: end.prev for rid, end in ends.items()}
        for op in ops:
            if isinstance(op, AppendCall):
                written = written_calls.get(op.record.call_id or "")
                results.append(written or self._stage_call(conn, op.record, staged))
                continue
            self._inserts.flush(conn, staged)
            if isinstance(op, CreateRollout):
                if op.rollout_id not in written_rollouts:
                    _create_rollout(conn, op)
                results.append(CreatedRollout(op.rollout_id, op.key))
            elif isinstance(op, UpdateRollout):
                results.append(_update_rollout(conn, op.rollout_id, op.values, op.change))
            else:
                results.append(op.fn(conn))
        self._inserts.flush(conn, staged)
        return results, staged

    def _stage_call(self, conn: Connection, record: CallRecord, staged: _Staged) -> CallReceipt:
        rid = record.rollout_id
        # A rollout created in this same transaction was not there when the seqs were locked.
        seq = staged.next_seq.get(rid, 1)
        staged.next_seq[rid] = seq + 1
        call_id = record.call_id or new_id()

        parent_id: str | None = None
        parent_choice: int | None = None
        shared = 0
        suffix = None
        if record.prompt_ids is not None:
            if rid not in self._recent:
                self._recent.load(
                    rid, queries.recent_known_calls(conn, rid, self._recent.per_rollout)
                )
            # The rollout's latest calls, this batch's own first: a rollout with many calls in
            # one batch (parallel sub-agents) must not make the search quadratic in the batch.
            newest = staged.known.get(rid, [])[-self._recent.per_rollout :]
            candidates = list(reversed(newest)) + self._recent.candidates(rid)
            ref = choose_parent(record.prompt_ids, candidates)
            parent_id, parent_choice, shared, suffix = (
                ref.parent_id,
                ref.parent_choice,
                ref.shared,
                ref.suffix,
            )
            completions = {c.index: c.token_ids for c in record.choices}
            staged.known.setdefault(rid, []).append(
                KnownCall(call_id, record.prompt_ids, completions)
            )

        usage = record.usage or {}
        prompt_tokens = (
            len(record.prompt_ids)
            if record.prompt_ids is not None
            else int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)
        )
        completion_tokens = sum(len(c.token_ids) for c in record.choices) or int(
            usage.get("completion_tokens") or usage.get("output_tokens") or 0
        )
        finish_reason = record.finish_reason
        if finish_reason is None and record.choices:
            finish_reason = record.choices[0].finish_reason
        staged.calls.append(
            {
                "id": call_id,
                "rollout_id": rid,
                "seq": seq,
                "dialect": record.dialect.value,
                "purpose": record.purpose,
                "model": record.model,
                "backend": record.backend,
                "status": record.status.value,
                "http_status": record.http_status,
                "error": record.error,
                "stream": record.stream,
                "capture": record.capture.value,
                "received_at": record.received_at,
                "dispatched_at": record.dispatched_at,
                "first_token_at": record.first_token_at,
                "finished_at": record.finished_at,
                "weight_version": record.weight_version,
                "finish_reason": finish_reason,
                "usage": record.usage,
                "retry_count": record.retry_count,
                "body_hash": record.body_hash,
                "retry_of": record.retry_of,
                "resumes": record.resumes,
                "bridge": record.bridge,
                "tool_parse": record.tool_parse,
                "weight_spans": record.weight_spans,
                "weights_digest": record.weights_digest,
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "n_choices": len(record.choices),
                "prompt_parent_id": parent_id,
                "prompt_parent_choice": parent_choice,
                "prompt_shared": shared,
                "prompt_suffix": None if suffix is None else pack(suffix),
            }
        )
        for choice in record.choices:
            staged.choices.append(
                {
                    "call_id": call_id,
                    "idx": choice.index,
                    "finish_reason": choice.finish_reason,
                    "n_tokens": len(choice.token_ids),
                    "token_ids": pack(choice.token_ids),
                    "logprobs": None if choice.logprobs is None else pack(choice.logprobs),
                }
            )
        _chain(record, staged)
        if record.request_body or record.engine_request or record.response_body:
            staged.bodies.append(
                {
                    "call_id": call_id,
                    "request": compress.deflate(record.request_body),
                    "engine_request": compress.deflate(record.engine_request),
                    "response": compress.deflate(record.response_body),
                }
            )
        if record.routed_experts:
            previous = staged.routed_latest.get(rid) or self._routed.latest(rid)
            source = record.routed_source or ""
            staged.routed += routed.stage(call_id, rid, source, record.routed_experts, previous)
            staged.routed_latest[rid] = {i: (call_id, a) for i, a in record.routed_experts.items()}
        if record.lineage is not None:
            mark = record.lineage
            staged.lineages.append(
                {
                    "call_id": call_id,
                    "rollout_id": rid,
                    "request": mark.request.hex(),
                    "answer": mark.answer.hex(),
                    "context": mark.context.hex(),
                }
            )
        return CallReceipt(call_id, seq)

    def forget(self, rollout_id: str) -> None:
        """Drop the cached recent calls of a rollout that will get no more calls."""
        if self._thread is not None:
            # The cache belongs to the writer thread; let it do the forgetting.
            self._thread.submit(self._recent.forget, rollout_id)
            self._thread.submit(self._routed.forget, rollout_id)
        else:
            self._recent.forget(rollout_id)
            self._routed.forget(rollout_id)


@dataclass(frozen=True)
class _RowInsert:
    """INSERT of plain tuples through the driver, for the tables written on every call.

    Core's execute spends more time per row on parameter handling than the database spends
    storing it; the rows here always carry every column, so the statement and each column's
    own bind processor (the same conversion Core applies) are prepared once per dialect.
    """

    sql: str
    values: Callable[[dict[str, Any]], tuple[Any, ...]]
    """A row's values in column order (one C call for all of them)."""
    processors: tuple[tuple[int, Callable[[Any], Any]], ...]
    """(position, bind processor) of the columns that have one."""

    @classmethod
    def of(cls, table: Table, dialect: Dialect) -> _RowInsert:
        names = tuple(c.name for c in table.columns)
        if dialect.paramstyle == "qmark":
            marks = ["?"] * len(names)
        else:  # asyncpg's adapter: $1, $2, ...
            marks = [f"${i}" for i in range(1, len(names) + 1)]
        quote = dialect.identifier_preparer.quote
        columns = ", ".join(quote(n) for n in names)
        sql = f"INSERT INTO {quote(table.name)} ({columns}) VALUES ({', '.join(marks)})"
        bound = (_processor(c.type, dialect) for c in table.columns)
        processors = tuple((i, p) for i, p in enumerate(bound) if p is not None)
        # A table of one column would make itemgetter return the value itself, not a tuple.
        getter = itemgetter(*names) if len(names) > 1 else lambda row: (row[names[0]],)
        return cls(sql, getter, processors)

    def execute(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        values = []
        for row in rows:
            value = list(self.values(row))
            for i, process in self.processors:
                value[i] = process(value[i])
            values.append(tuple(value))  # Core takes a list of tuples, not of lists
        if conn.dialect.driver != "pysqlite":
            conn.exec_driver_sql(self.sql, values)
            return
        # The connection's own sqlite3 cursor, inside the same transaction: Core's execution
        # context, events and result around each statement cost more than SQLite's insert.
        # Its errors are sqlite3's own, which the writer reads as SQLAlchemy's (outage.py).
        cursor = conn.connection.cursor()
        try:
            cursor.executemany(self.sql, values)
        finally:
            cursor.close()


def _processor(column_type: Any, dialect: Dialect) -> Callable[[Any], Any] | None:
    if dialect.name == "sqlite" and isinstance(column_type, UTCDateTime):
        return _sqlite_utc_text
    processor: Callable[[Any], Any] | None = column_type._cached_bind_processor(dialect)
    return processor


def _sqlite_utc_text(value: datetime | None) -> str | None:
    """What UTCDateTime's bind processor makes of `value` on SQLite, the same text, at half its
    cost (four per call): Core formats through a dict of seven fields after a conversion to UTC
    that an aware UTC value does not need."""
    if value is None:
        return None
    if value.tzinfo is not UTC:
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; pass an aware UTC datetime")
        value = value.astimezone(UTC)
    return "%04d-%02d-%02d %02d:%02d:%02d.%06d" % (  # noqa: UP031 - the cheapest formatting here
        value.year,
        value.month,
        value.day,
        value.hour,
        value.minute,
        value.second,
        value.microsecond,
    )


class _Inserts:
    """The writer's prepared row inserts, by dialect and table."""

    def __init__(self) -> None:
        self._prepared: dict[tuple[str, str], _RowInsert] = {}

    def insert(self, conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
        if conn.dialect.paramstyle not in ("qmark", "numeric_dollar"):
            conn.execute(insert(table), rows)
            return
        key = (conn.dialect.name, table.name)
        prepared = self._prepared.get(key)
        if prepared is None:
            prepared = self._prepared[key] = _RowInsert.of(table, conn.dialect)
        prepared.execute(conn, rows)

    def flush(self, conn: Connection, staged: _Staged) -> None:
        if staged.calls:
            self.insert(conn, call_table, staged.calls)
            staged.calls = []
        if staged.choices:
            self.insert(conn, choice_table, staged.choices)
            staged.choices = []
        if staged.bodies:
            self.insert(conn, call_body_table, staged.bodies)
            staged.bodies = []
        if staged.lineages:
            self.insert(conn, lineage_turn_table, staged.lineages)
            staged.lineages = []
        if staged.routed:
            self.insert(conn, routed_experts_table, staged.routed)
            staged.routed = []


def _has_room(path: Path) -> bool:
    """Whether the database file's filesystem has space again for a few batches of writes."""
    try:
        return shutil.disk_usage(path.parent).free >= ROOM_TO_RESUME
    except OSError:
        return True  # let the probe write decide


def _touch(conn: Connection) -> None:
    """A write that changes nothing, yet needs the disk (SQLite rewrites the page, PostgreSQL a
    row version): whether the store takes writes again."""
    conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = version_num"))


def _create_rollout(conn: Connection, op: CreateRollout) -> None:
    new = op.new
    conn.execute(
        insert(rollout_table).values(
            id=op.rollout_id,
            key_hash=hash_key(op.key),
            batch_id=new.batch_id,
            task_id=new.task_id,
            sample_index=new.sample_index,
            attempt=new.attempt,
            harness=new.harness,
            model=new.model,
            status=lifecycle.CREATED.value,
            max_calls=new.max_calls,
            max_tokens=new.max_tokens,
            created_at=datetime.now(UTC),
            metadata=new.meta,
        )
    )


def _chain(record: CallRecord, staged: _Staged) -> None:
    """Set the digest and hash of the call just staged (the last row) and move the chain on."""
    row = staged.calls[-1]
    choices = staged.choices[len(staged.choices) - len(record.choices) :]
    prompt = b"" if record.prompt_ids is None else pack(record.prompt_ids)
    bodies = [
        chain.body_digest(b)
        for b in (record.request_body, record.engine_request, record.response_body)
    ]
    digest = chain.call_digest(row, prompt, choices, bodies)
    linked = chain.link(staged.prev_hash.get(row["rollout_id"], chain.GENESIS), digest)
    staged.prev_hash[row["rollout_id"]] = linked
    row["digest"], row["hash"] = digest.hex(), linked.hex()


_OPEN = (RolloutStatus.PENDING.value, RolloutStatus.RUNNING.value)


def _sealed(
    conn: Connection, rollout_id: str, values: dict[str, Any], status: str, flags: Any
) -> dict[str, Any]:
    """`values` with the head sealed, when the rollout ends now or has ended (`status`, `flags`:
    what its row holds, read under its lock): its chain's end (again, if calls were refused
    since) with its hack flags (chain.py)."""
    if values.get("status", status) in _OPEN:
        return values
    flags = values.get("hack_flags", flags)
    seq, end = queries.chain_end(conn, rollout_id)
    return {**values, "head_seq": seq, "head_hash": chain.sealed_head(end, flags or None)}


def _update_rollout(
    conn: Connection, rollout_id: str, values: dict[str, Any], change: lifecycle.Change
) -> RolloutView:
    """One write to a rollout, resolved against its row as it is now (store/lifecycle.py);
    returns the row as the write left it."""
    table = rollout_table
    queries.lock_rollout(conn, rollout_id)
    stored = conn.execute(
        select(table.c.status, table.c.metadata, table.c.hack_flags).where(table.c.id == rollout_id)
    ).first()
    if stored is None:
        raise NotFound(f"no rollout {rollout_id!r}")
    resolved = lifecycle.resolve(rollout_id, stored.status, stored.metadata, values, change)
    if resolved is None:
        return queries.rollout(conn, rollout_id)
    if "meta" in resolved:
        resolved["metadata"] = resolved.pop("meta")
    if resolved.get("status", RolloutStatus.RUNNING.value) not in _OPEN or "hack_flags" in resolved:
        resolved = _sealed(conn, rollout_id, resolved, stored.status, stored.hack_flags)
    if resolved:
        conn.execute(update(table).where(table.c.id == rollout_id).values(**resolved))
    return queries.rollout(conn, rollout_id)
