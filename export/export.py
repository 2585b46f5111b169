"""Trajectories out to trainers: Parquet (pyarrow), JSON lines, and JSON-able dicts for the API.

Parquet columns: the token arrays as list<int32> (``prompt_ids``, ``response_ids``), list<int8>
(``loss_mask``) and list<float32> (``logprobs``), then one scalar column per `Trajectory` field
(the link flattened into ``parent_segment``, ``link_kind``, ``branch_call_id``, ``branch_choice``,
``branch_position``, ``drift``, ``drift_detail`` as JSON text), and ``head_hash``: the rollout's
sealed hash-chain head (store/chain.py), null while it runs. ``reward`` is the rollout's, the
same on each of its ``n_segments`` rows; ``is_replay``/``replay_of`` mark a replay of another
rollout (the same tokens a second time). ``routed_experts`` (binary: the C-order
little-endian bytes of the trajectory's routed experts, store/routed.py) with
``routed_experts_dtype`` (uint8, uint16, int32) and ``routed_experts_shape`` ([n_tokens - 1,
layers, top-k], or [n_tokens - 1, layers * top-k] from SGLang), all null when it has none.
``hack_flags``: the reward-hack detectors that flagged the rollout (analysis/hacks.py), empty when
none did, null when it was never checked. JSON lines carry the same names, ``routed_experts``
as base64.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from ..analysis.bridging import Bridging
from ..analysis.drift import Detokenizer
from ..analysis.reading import rollout_trajectories
from ..analysis.trajectory import RolloutTrajectories, Trajectory
from ..audit.integrity import verify_rollout
from ..store.store import Store
from . import columns

FLUSH_TOKENS = 1_000_000
"""Tokens buffered before a Parquet row group is written. The writer holds a row group's
repetition and definition levels, 4 bytes a token per list column, in fresh memory: at 4 M
tokens the first row group's page faults cost the process 0.1 to 0.3 CPU-s of system time,
at 1 M 0.03 to 0.1, and later row groups reuse that memory (bench/export_bench.py)."""

SCHEMA = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("segment", pa.int32()),
        ("role", pa.string()),
        ("reward", pa.float64()),
        ("status", pa.string()),
        ("batch_id", pa.string()),
        ("task_id", pa.string()),
        ("sample_index", pa.int32()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("logprobs", pa.list_(pa.float32())),
        ("has_logprobs", pa.bool_()),
        ("sampled_tokens", pa.int32()),
        ("lost_tokens", pa.int32()),
        ("rollout_faithfulness", pa.float64()),
        ("call_ids", pa.list_(pa.string())),
        ("weight_versions", pa.list_(pa.string())),
        # Which version sampled which tokens of response_ids (Trajectory.weight_spans).
        (
            "weight_spans",
            pa.list_(
                pa.struct([("version", pa.string()), ("start", pa.int32()), ("end", pa.int32())])
            ),
        ),
        ("finish_reason", pa.string()),
        ("parent_segment", pa.int32()),
        ("link_kind", pa.string()),
        ("branch_call_id", pa.string()),
        ("branch_choice", pa.int32()),
        ("branch_position", pa.int32()),
        ("drift", pa.string()),
        ("drift_detail", pa.string()),
        ("head_hash", pa.string()),
        ("n_segments", pa.int32()),
        ("is_replay", pa.bool_()),
        ("replay_of", pa.string()),
        ("routed_experts", pa.binary()),
        ("routed_experts_dtype", pa.string()),
        ("routed_experts_shape", pa.list_(pa.int32())),
        ("hack_flags", pa.list_(pa.string())),
    ]
)


class TrajectoryWriter(Protocol):
    def write(self, trajectories: Sequence[Trajectory]) -> None: ...

    def close(self) -> None: ...


def open_writer(fmt: str, path: str | Path) -> TrajectoryWriter:
    if fmt == "parquet":
        return ParquetTrajectoryWriter(path)
    if fmt == "jsonl":
        return JsonlTrajectoryWriter(path)
    raise ValueError(f"unknown export format {fmt!r}; use parquet or jsonl")


TOKEN_COLUMNS = ("prompt_ids", "response_ids", "loss_mask", "logprobs")
"""Written without dictionary encoding or statistics: see ParquetTrajectoryWriter."""


class ParquetTrajectoryWriter:
    def __init__(self, path: str | Path, *, compression: str = "zstd") -> None:
        # The token columns skip dictionary encoding and min/max statistics, half of the
        # writer's CPU (bench/export_bench.py): the dictionary hashes every token for ids that
        # zstd packs about as well from plain pages (smaller on a real tokenizer's ids, 15%
        # larger on the bench's uniform random ones), and no reader prunes on a token's range.
        others = [name for name in SCHEMA.names if name not in TOKEN_COLUMNS]
        self._writer = pq.ParquetWriter(
            str(path),
            SCHEMA,
            compression=compression,
            use_dictionary=others,
            write_statistics=others,
        )

    def write(self, trajectories: Sequence[Trajectory]) -> None:
        if trajectories:
            self._writer.write_table(arrow_table(trajectories))

    def close(self) -> None:
        self._writer.close()


class JsonlTrajectoryWriter:
    def __init__(self, path: str | Path) -> None:
        self._file = Path(path).open("wb")  # noqa: SIM115 - closed by close()

    def write(self, trajectories: Sequence[Trajectory]) -> None:
        option = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE
        for t in trajectories:
            self._file.write(orjson.dumps(_row(t, arrays=True), option=option))

    def close(self) -> None:
        self._file.close()


@dataclass
class ExportStats:
    rollouts: int = 0
    trajectories: int = 0
    tokens: int = 0
    """Prompt plus response tokens over all trajectories written."""
    sampled_tokens: int = 0


def write_all(
    built: Iterable[RolloutTrajectories],
    writer: TrajectoryWriter,
    *,
    on_rollout: Callable[[RolloutTrajectories], None] | None = None,
    flush_tokens: int = FLUSH_TOKENS,
) -> ExportStats:
    """Write every trajectory of every rollout, in row groups of about `flush_tokens` tokens."""
    stats = ExportStats()
    buffer: list[Trajectory] = []
    buffered = 0
    for rollout in built:
        for t in rollout.trajectories:
            buffer.append(t)
            buffered += t.n_tokens
            stats.trajectories += 1
            stats.tokens += t.n_tokens
            stats.sampled_tokens += t.sampled_tokens
        stats.rollouts += 1
        if buffered >= flush_tokens:
            writer.write(buffer)
            buffer, buffered = [], 0
        if on_rollout is not None:
            on_rollout(rollout)
    writer.write(buffer)
    return stats


def arrow_table(trajectories: Sequence[Trajectory]) -> pa.Table:
    ts = trajectories
    arrays: dict[str, pa.Array] = {
        "prompt_ids": columns.lists([t.prompt_ids for t in ts], SCHEMA.field("prompt_ids").type),
        "response_ids": columns.lists(
            [t.response_ids for t in ts], SCHEMA.field("response_ids").type
        ),
        "loss_mask": columns.lists([t.loss_mask for t in ts], SCHEMA.field("loss_mask").type),
        "logprobs": columns.lists([t.logprobs for t in ts], SCHEMA.field("logprobs").type),
        "routed_experts": columns.column([_routing_bytes(t) for t in ts], pa.binary()),
    }
    rows = [_row(t, arrays=False) for t in ts]
    for field in SCHEMA:
        if field.name not in arrays:
            arrays[field.name] = columns.column([r[field.name] for r in rows], field.type)
    return pa.table([arrays[f.name] for f in SCHEMA], schema=SCHEMA)


def _row(t: Trajectory, *, arrays: bool) -> dict[str, Any]:
    link, drift = t.link, None if t.link is None else t.link.drift
    routing = t.routed_experts
    row: dict[str, Any] = {
        "rollout_id": t.rollout_id,
        "segment": t.segment,
        "role": t.role.value,
        "reward": t.reward,
        "status": t.status.value,
        "batch_id": t.batch_id,
        "task_id": t.task_id,
        "sample_index": t.sample_index,
        "has_logprobs": t.has_logprobs,
        "sampled_tokens": t.sampled_tokens,
        "lost_tokens": t.lost_tokens,
        "rollout_faithfulness": t.rollout_faithfulness,
        "call_ids": list(t.call_ids),
        "weight_versions": list(t.weight_versions),
        "weight_spans": [{"version": v, "start": a, "end": b} for v, a, b in t.weight_spans],
        "finish_reason": t.finish_reason,
        "parent_segment": None if link is None else link.parent_segment,
        "link_kind": None if link is None else link.kind.value,
        "branch_call_id": None if link is None else link.call_id,
        "branch_choice": None if link is None else link.choice,
        "branch_position": None if link is None else link.position,
        "drift": None if drift is None else drift.kind.value,
        "drift_detail": None if drift is None else json.dumps(drift.as_dict()),
        "head_hash": t.head_hash,
        "n_segments": t.n_segments,
        "is_replay": t.replay_of is not None,
        "replay_of": t.replay_of,
        "routed_experts_dtype": None if routing is None else routing.dtype.name,
        "routed_experts_shape": None if routing is None else list(routing.shape),
        "hack_flags": None if t.hack_flags is None else list(t.hack_flags),
    }
    if arrays:
        row |= {
            "prompt_ids": t.prompt_ids,
            "response_ids": t.response_ids,
            "loss_mask": t.loss_mask,
            "logprobs": t.logprobs,
            "routed_experts": _routing_base64(t),
        }
    return row


def _routing_bytes(t: Trajectory) -> bytes | None:
    routing = t.routed_experts
    return None if routing is None else np.ascontiguousarray(routing).tobytes()


def _routing_base64(t: Trajectory) -> str | None:
    data = _routing_bytes(t)
    return None if data is None else base64.b64encode(data).decode("ascii")


def segment_dict(t: Trajectory) -> dict[str, Any]:
    """A trajectory's fields as JSON values, without its token arrays (their lengths instead)."""
    row = _row(t, arrays=False)
    del row["drift_detail"]
    row["link"] = None if t.link is None else t.link.as_dict()
    return row | {"prompt_tokens": len(t.prompt_ids), "response_tokens": len(t.response_ids)}


def trajectory_dict(t: Trajectory) -> dict[str, Any]:
    """A trajectory as plain JSON values (lists, not arrays; a missing logprob is null)."""
    row = segment_dict(t)
    del row["prompt_tokens"], row["response_tokens"]
    logprobs: list[float | None] = t.logprobs.tolist()
    if not t.has_logprobs:
        logprobs = [None if np.isnan(x) else x for x in t.logprobs.tolist()]
    return row | {
        "prompt_ids": t.prompt_ids.tolist(),
        "response_ids": t.response_ids.tolist(),
        "loss_mask": t.loss_mask.tolist(),
        "logprobs": logprobs,
        "routed_experts": _routing_base64(t),
    }


def rollout_dict(built: RolloutTrajectories) -> dict[str, Any]:
    """One rollout's trajectories, breaks and faithfulness as JSON values: the body of
    `GET /admin/rollouts/{id}/trajectory`."""
    r = built.rollout
    return {
        "rollout": {
            "id": r.id,
            "status": r.status.value,
            "reward": r.reward,
            "verdict": r.verdict.value,
            "batch_id": r.batch_id,
            "task_id": r.task_id,
            "sample_index": r.sample_index,
            "head_hash": r.head_hash,
            "hack_flags": r.hack_flags,
        },
        "faithfulness": built.faithfulness.as_dict(),
        "trajectories": [trajectory_dict(t) for t in built.trajectories],
        "skipped_calls": [
            {"call_id": s.call_id, "seq": s.seq, "reason": s.reason} for s in built.skipped
        ],
        "text_only_calls": list(built.text_only),
    }


async def rollout_document(
    store: Store, rollout_id: str, *, detokenizer: Detokenizer | None = None
) -> dict[str, Any]:
    """Everything `rolltap show` prints, as JSON values (`rolltap show --json`): the rollout, its
    calls, its integrity, its segments (without token arrays) with their faithfulness, and its
    egress requests."""
    view = await store.rollout(rollout_id)
    calls = await store.calls(rollout_id)
    bridging = Bridging.of(c.bridge for c in calls)
    document: dict[str, Any] = {
        "rollout": view.as_dict(),
        "calls": [c.as_dict() for c in calls],
        "integrity": (await verify_rollout(store, rollout_id)).as_dict(),
        "bridging": None if bridging is None else bridging.as_dict(),
        "faithfulness": None,
        "segments": [],
        "egress": [e.as_dict() for e in await store.egress(rollout_id)],
    }
    if calls:
        built = await rollout_trajectories(store, rollout_id, detokenizer=detokenizer)
        document["faithfulness"] = built.faithfulness.as_dict()
        document["segments"] = [segment_dict(t) for t in built.trajectories]
    return document


async def rollout_trajectory_json(
    store: Store, rollout_id: str, *, detokenizer: Detokenizer | None = None
) -> dict[str, Any]:
    """`rollout_dict` of a rollout read from `store` (raises NotFound for an unknown id)."""
    return rollout_dict(await rollout_trajectories(store, rollout_id, detokenizer=detokenizer))
