"""The tables: rollouts, the calls a proxy received for them, and each call's sampled choices.

Token arrays are packed little-endian blobs (see `packing`), never JSON lists. A call's prompt is
stored as a reference to the longest earlier prompt-or-sequence of the same rollout that it
shares a prefix with, plus the new suffix (see `delta`), so a long rollout costs storage linear in
its unique tokens.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any, ClassVar, cast

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Named here too, where the tables that hold them are, as they always were.
from .enums import CallDialect as CallDialect
from .enums import CallStatus as CallStatus
from .enums import Capture as Capture
from .enums import DriftClass as DriftClass
from .enums import EgressVerdict as EgressVerdict
from .enums import LinkKind as LinkKind
from .enums import RolloutStatus as RolloutStatus
from .enums import Verdict as Verdict

# Fixed names, so alembic's autogenerate and every database agree on what to drop or alter.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores naive text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; pass an aware UTC datetime")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, datetime: UTCDateTime}


def _in(column: str, values: type[enum.StrEnum]) -> str:
    return f"{column} IN ({', '.join(repr(v.value) for v in values)})"


class Rollout(Base):
    __tablename__ = "rollout"

    id: Mapped[str] = mapped_column(String(26), primary_key=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    """sha256 of the secret rollout key; the key itself is never stored."""
    batch_id: Mapped[str | None] = mapped_column(String(200))
    task_id: Mapped[str | None] = mapped_column(String(200))
    sample_index: Mapped[int | None] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """A sample is retried as a new attempt (an infrastructure failure, an interrupted run);
    the attempt it replaces is marked cancelled and points to it in metadata."""
    harness: Mapped[str | None] = mapped_column(String(100))
    model: Mapped[str | None] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(20), default=RolloutStatus.PENDING.value)
    reward: Mapped[float | None] = mapped_column(Float)
    reward_details: Mapped[dict[str, Any] | None]
    error: Mapped[str | None] = mapped_column(Text)
    max_calls: Mapped[int | None] = mapped_column(Integer)
    """Budget enforced by the proxy: calls beyond it are refused and end the rollout."""
    max_tokens: Mapped[int | None] = mapped_column(Integer)
    """Budget on prompt + completion tokens over all calls."""
    created_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    key_revoked_at: Mapped[datetime | None]
    """When the runner revoked the key (its harness ended): the proxy refuses later calls."""
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    head_hash: Mapped[str | None] = mapped_column(String(64))
    """The hash of the highest-seq call when the rollout ended: the head of its chain (chain.py)."""
    head_seq: Mapped[int | None] = mapped_column(Integer)
    """That call's seq (0: the rollout ended without calls)."""
    hack_flags: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    """What the reward-hack detectors flagged (analysis/hacks.py): None when never checked, [] when
    checked and clean. Non-empty flags are sealed into `head_hash` (chain.py)."""

    __table_args__ = (
        CheckConstraint(_in("status", RolloutStatus), name="status"),
        # One rollout per (batch, task, sample, attempt): a resumed batch never duplicates one.
        UniqueConstraint("batch_id", "task_id", "sample_index", "attempt"),
        Index(None, "status", "created_at"),
        Index(None, "created_at"),
    )


class Call(Base):
    """One request the proxy received, attempts and retries included."""

    __tablename__ = "call"

    id: Mapped[str] = mapped_column(String(26), primary_key=True)
    rollout_id: Mapped[str] = mapped_column(ForeignKey("rollout.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    """Order of the call within its rollout, from 1, in the order records became durable."""
    dialect: Mapped[str] = mapped_column(String(16))
    purpose: Mapped[str | None] = mapped_column(String(40))
    """A side call's role when the harness says it (title, compact, subagent...)."""
    model: Mapped[str | None] = mapped_column(String(200))
    backend: Mapped[str | None] = mapped_column(String(300))
    status: Mapped[str] = mapped_column(String(16))
    http_status: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    stream: Mapped[bool] = mapped_column(Boolean, default=False)
    capture: Mapped[str] = mapped_column(String(8))
    received_at: Mapped[datetime]
    dispatched_at: Mapped[datetime | None]
    first_token_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    weight_version: Mapped[str | None] = mapped_column(String(100))
    finish_reason: Mapped[str | None] = mapped_column(String(40))
    usage: Mapped[dict[str, Any] | None]
    retry_count: Mapped[int] = mapped_column(Integer, default=0)
    """The SDK's retry header (x-stainless-retry-count) as the client sent it."""
    body_hash: Mapped[str | None] = mapped_column(String(32))
    """blake2b-128 of the client's request body, to link a retry to the call it repeats."""
    retry_of: Mapped[str | None] = mapped_column(ForeignKey("call.id", ondelete="SET NULL"))
    resumes: Mapped[str | None] = mapped_column(ForeignKey("call.id", ondelete="SET NULL"))
    bridge: Mapped[str | None] = mapped_column(String(32))
    """Token-in mode: `bridged` (the prompt is the previous call's prompt and answer plus the
    bridge), or why the call fell back to a rendered prompt (proxy/tokenin/lineage.py).
    None: a call in normal mode."""
    tool_parse: Mapped[str | None] = mapped_column(String(200))
    """Whether the answer's tool calls parsed, where rolltap (token-in) or its built-in engine
    parsed them: `ok`, `malformed: <reason>` or `none` (analysis/toolparse.py). None: nothing
    said (vLLM's and SGLang's own parsers, a call without tools)."""
    weight_spans: Mapped[dict[str, Any] | None]
    """An answer sampled across an in_place weight update: choice -> [[version, start, end],
    ...] over its sampled tokens (store/records.py WeightSpans). None: one version sampled it
    all, the call's `weight_version`."""
    weights_digest: Mapped[str | None] = mapped_column(String(64))
    """SHA-256 (hex) of the per-parameter checksums of the weights its version was served
    with, where the engines offer them (`weight_checksum`, vLLM's /weight_checker): sealed into
    the call's digest, so the chain says which weights served it."""
    """The call whose answer this one continues: its engine aborted it for a weight update and
    the proxy sent the prompt plus the partial answer back, token-in, on the new weights."""
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    """Sum over all choices."""
    n_choices: Mapped[int] = mapped_column(Integer, default=0)
    prompt_parent_id: Mapped[str | None] = mapped_column(ForeignKey("call.id"))
    prompt_parent_choice: Mapped[int | None] = mapped_column(Integer)
    """None: the parent's prompt; k: the parent's prompt followed by its choice k's tokens."""
    prompt_shared: Mapped[int] = mapped_column(Integer, default=0)
    """How many leading tokens of the prompt come from the parent sequence."""
    digest: Mapped[str | None] = mapped_column(String(64))
    """SHA-256 of the record's canonical encoding (chain.py); None before the chain existed."""
    hash: Mapped[str | None] = mapped_column(String(64))
    """SHA-256 chaining `digest` to the hash of the rollout's previous call (chain.py)."""
    prompt_suffix: Mapped[bytes | None] = mapped_column(LargeBinary)
    """The prompt's remaining ids, packed int32 little-endian. Last column: big values last."""

    __table_args__ = (
        CheckConstraint(_in("status", CallStatus), name="status"),
        CheckConstraint(_in("dialect", CallDialect), name="dialect"),
        CheckConstraint(_in("capture", Capture), name="capture"),
        UniqueConstraint("rollout_id", "seq"),
        Index(None, "received_at"),
        Index(None, "rollout_id", "body_hash", "seq"),
        Index(None, "prompt_parent_id"),
    )


class Choice(Base):
    """One sampled choice of a call (`n > 1` keeps every one)."""

    __tablename__ = "choice"

    call_id: Mapped[str] = mapped_column(
        ForeignKey("call.id", ondelete="CASCADE"), primary_key=True
    )
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    finish_reason: Mapped[str | None] = mapped_column(String(40))
    n_tokens: Mapped[int] = mapped_column(Integer)
    token_ids: Mapped[bytes] = mapped_column(LargeBinary)
    """Packed int32 little-endian: exactly the ids the engine sampled."""
    logprobs: Mapped[bytes | None] = mapped_column(LargeBinary)
    """Packed float32 little-endian, one per token id; None when the engine gave none."""


class CallBody(Base):
    """What went over the wire, compressed (store/compress.py): for audit and replay, never read on
    hot paths."""

    __tablename__ = "call_body"

    call_id: Mapped[str] = mapped_column(
        ForeignKey("call.id", ondelete="CASCADE"), primary_key=True
    )
    request: Mapped[bytes | None] = mapped_column(LargeBinary)
    """The client's request body."""
    engine_request: Mapped[bytes | None] = mapped_column(LargeBinary)
    """The request actually sent to the engine."""
    response: Mapped[bytes | None] = mapped_column(LargeBinary)
    """The response the client received (for a stream, the assembled equivalent)."""


class RoutedExperts(Base):
    """The MoE experts each token of a call's prompt and answer was routed to (routing replay,
    R3), one row per choice, as the engine sent them (store/routed.py)."""

    __tablename__ = "routed_experts"

    call_id: Mapped[str] = mapped_column(
        ForeignKey("call.id", ondelete="CASCADE"), primary_key=True
    )
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    """The choice."""
    rollout_id: Mapped[str] = mapped_column(ForeignKey("rollout.id", ondelete="CASCADE"))
    source: Mapped[str] = mapped_column(String(16))
    """The engine's encoding it was read from: vllm or sglang (proxy/upstream/routed.py)."""
    dtype: Mapped[str] = mapped_column(String(8))
    """uint8, uint16 or int32: the narrowest that holds every expert id."""
    shape: Mapped[list[int]] = mapped_column(JSON)
    """Of the whole array: [tokens - 1, layers, top-k] (vLLM) or [tokens - 1, layers * top-k]
    (SGLang sends no split)."""
    base_call_id: Mapped[str | None] = mapped_column(ForeignKey("call.id"))
    base_idx: Mapped[int | None] = mapped_column(Integer)
    base_rows: Mapped[int] = mapped_column(Integer, default=0)
    """The first rows are byte for byte the first rows of the base call's choice (the shared
    prefix of a conversation); only the rest is in `data`."""
    data: Mapped[bytes] = mapped_column(LargeBinary)
    """Rows from `base_rows` on, C-order, little-endian."""

    __table_args__ = (Index(None, "rollout_id"),)


# Typed handles for Core statements on the hot paths (ORM unit-of-work is too slow there).
rollout_table = cast(Table, Rollout.__table__)
call_table = cast(Table, Call.__table__)
choice_table = cast(Table, Choice.__table__)
call_body_table = cast(Table, CallBody.__table__)
routed_experts_table = cast(Table, RoutedExperts.__table__)


# --- trajectory analysis (where a rollout's token chain broke) ------------------------------


class SegmentBreak(Base):
    """One row per call that started a linked segment: a drift break or a side call."""

    __tablename__ = "segment_break"

    call_id: Mapped[str] = mapped_column(
        ForeignKey("call.id", ondelete="CASCADE"), primary_key=True
    )
    rollout_id: Mapped[str] = mapped_column(ForeignKey("rollout.id", ondelete="CASCADE"))
    segment: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    drift: Mapped[str | None] = mapped_column(String(32))
    """The drift class of a break; None for a side call."""
    parent_call_id: Mapped[str | None] = mapped_column(ForeignKey("call.id", ondelete="SET NULL"))
    parent_choice: Mapped[int | None] = mapped_column(Integer)
    position: Mapped[int] = mapped_column(Integer)
    """Index of the first token that differs from the parent's sequence."""
    detail: Mapped[dict[str, Any] | None]

    __table_args__ = (
        CheckConstraint(_in("kind", LinkKind), name="kind"),
        CheckConstraint(_in("drift", DriftClass), name="drift"),
        Index(None, "rollout_id"),
        Index(None, "drift"),
    )


class RolloutFaithfulness(Base):
    """A rollout's faithfulness summary, as of the last analysis."""

    __tablename__ = "rollout_faithfulness"

    rollout_id: Mapped[str] = mapped_column(
        ForeignKey("rollout.id", ondelete="CASCADE"), primary_key=True
    )
    analyzed_at: Mapped[datetime]
    calls: Mapped[int] = mapped_column(Integer)
    """Calls the rollout had when analysed: fewer than it has now means the row is stale."""
    segments: Mapped[int] = mapped_column(Integer)
    sampled_tokens: Mapped[int] = mapped_column(Integer)
    lost_tokens: Mapped[int] = mapped_column(Integer)
    """Sampled tokens that a later call of the same line did not see verbatim."""
    share: Mapped[float] = mapped_column(Float)
    """1 - lost / sampled: the share of sampled tokens still in the context they came from."""
    breaks: Mapped[dict[str, Any]]
    """Number of breaks by drift class."""
    side_calls: Mapped[int] = mapped_column(Integer)
    text_only_calls: Mapped[int] = mapped_column(Integer)
    skipped_calls: Mapped[int] = mapped_column(Integer)

    __table_args__ = (Index(None, "share"),)


class EgressRequest(Base):
    """One request a sandbox sent out through the run's egress gate (runner/egress)."""

    __tablename__ = "egress_request"

    id: Mapped[str] = mapped_column(String(26), primary_key=True)
    rollout_id: Mapped[str] = mapped_column(ForeignKey("rollout.id", ondelete="CASCADE"))
    at: Mapped[datetime]
    """When the gate received the request's headers."""
    method: Mapped[str] = mapped_column(String(16))
    host: Mapped[str] = mapped_column(String(255))
    path: Mapped[str] = mapped_column(Text)
    status: Mapped[int | None] = mapped_column(Integer)
    """The HTTP status the sandbox got; None when no response came (the upstream failed)."""
    request_bytes: Mapped[int] = mapped_column(Integer)
    response_bytes: Mapped[int] = mapped_column(Integer)
    verdict: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text)

    __table_args__ = (
        CheckConstraint(_in("verdict", EgressVerdict), name="verdict"),
        Index(None, "rollout_id", "at"),
    )


class LineageTurn(Base):
    """Where a token-in call stands in its conversation (proxy/tokenin/lineage.py), so that any
    proxy process on this store can continue it: another replica or worker, or this one after a
    restart. Fingerprints only; the ids are the call's own."""

    __tablename__ = "lineage_turn"

    call_id: Mapped[str] = mapped_column(
        ForeignKey("call.id", ondelete="CASCADE"), primary_key=True
    )
    rollout_id: Mapped[str] = mapped_column(ForeignKey("rollout.id", ondelete="CASCADE"))
    request: Mapped[str] = mapped_column(String(32))
    """Hash of the messages the call answered (hex), which the next request's prefix repeats."""
    answer: Mapped[str] = mapped_column(String(32))
    """Fingerprint of the assistant message served."""
    context: Mapped[str] = mapped_column(String(32))
    """Fingerprint of the tools and template options it rendered with."""

    __table_args__ = (Index(None, "rollout_id", "request"),)


class MetricsSource(enum.StrEnum):
    TRAINER = "trainer"
    """Posted by the trainer (`POST /v1/batches/{id}/metrics`): logprob mismatch, seconds..."""
    SERVICE = "service"
    """Written by the rollout service when a batch starts and ends: its session, labels and
    groups kept and dropped (what only the running service knew)."""


class BatchMetrics(Base):
    """Figures about a batch beyond its rollouts, as posted; the training view reads them."""

    __tablename__ = "batch_metrics"

    id: Mapped[str] = mapped_column(String(26), primary_key=True)
    batch_id: Mapped[str] = mapped_column(String(200))
    source: Mapped[str] = mapped_column(String(16))
    policy_version: Mapped[str | None] = mapped_column(String(100))
    """The policy version the figures are about (the batch's, unless the poster said)."""
    session: Mapped[str | None] = mapped_column(String(26))
    """The rollout-service session that ran the batch (service rows)."""
    posted_at: Mapped[datetime]
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)

    __table_args__ = (
        CheckConstraint(_in("source", MetricsSource), name="source"),
        Index(None, "batch_id", "posted_at"),
        Index(None, "session"),
    )


class WeightChecksum(Base):
    """The per-parameter checksums one engine reported for one weight version, read at the
    commit that put the version in (proxy/control/weights.py)."""

    __tablename__ = "weight_checksum"

    id: Mapped[str] = mapped_column(String(26), primary_key=True)
    weight_version: Mapped[str] = mapped_column(String(100))
    backend: Mapped[str] = mapped_column(String(300))
    recorded_at: Mapped[datetime]
    checksums: Mapped[dict[str, Any]] = mapped_column(JSON)
    """Parameter name -> the engine's checksum of it. Their digest is always computed from
    them (store/weights.py), never stored beside them: an auditor must not trust a copy."""

    __table_args__ = (Index(None, "weight_version", "recorded_at"),)


class BatchLease(Base):
    """Which process runs a batch now (runner/lease.py): one row per batch being run, its
    heartbeat renewed while it runs, taken over once its holder is gone, deleted at its end."""

    __tablename__ = "batch_lease"

    batch_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    token: Mapped[str] = mapped_column(String(40))
    """The holder's own: it keys that run's sandboxes (a sweep after it is gone finds them)."""
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    process_start: Mapped[str] = mapped_column(String(40))
    """When the holder's process started, as its host reports it: a reused pid is not it."""
    acquired_at: Mapped[datetime]
    heartbeat_at: Mapped[datetime]


segment_break_table = cast(Table, SegmentBreak.__table__)
lineage_turn_table = cast(Table, LineageTurn.__table__)
egress_request_table = cast(Table, EgressRequest.__table__)
rollout_faithfulness_table = cast(Table, RolloutFaithfulness.__table__)
batch_metrics_table = cast(Table, BatchMetrics.__table__)
weight_checksum_table = cast(Table, WeightChecksum.__table__)
batch_lease_table = cast(Table, BatchLease.__table__)
