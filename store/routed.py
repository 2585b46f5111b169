"""The MoE experts each token was routed to (routing replay, R3), stored beside its tokens.

A call choice's routed experts are one array of expert ids, row i for token i of its prompt
followed by its answer: tokens - 1 rows (the last sampled token was never forwarded), each
layers x top-k (vLLM) or layers * top-k flat (SGLang sends no split; proxy/upstream/routed.py). It
is kept
packed (uint8, uint16, or int32 when ids do not fit), C-order little-endian, in table
`routed_experts` with its dtype and shape.

A conversation's next call repeats its predecessor's prefix, and so its rows: a call's first rows
that are byte for byte the first rows of the rollout's previous routed call (`base_call_id`,
`base_idx`, `base_rows`) are not stored again, only the rows after them. Reading follows that
chain back and returns exactly the array the engine sent; the writer compares bytes, so nothing
is assumed about the engine's cache.

A trajectory carries the rows of its sequence (`prompt_ids` then `response_ids`) from its last
call, whose prompt holds everything before its answer: `len(prompt_ids) + len(response_ids) - 1`
rows, row i aligned with token i; None when that call has none.
"""

from __future__ import annotations

import base64
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Select, select
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from .models import routed_experts_table
from .packing import RoutingArray

RE = routed_experts_table
DTYPES = ("uint8", "uint16", "int32")

Key = tuple[str, int]
"""(call id, choice index)."""


@dataclass(frozen=True)
class StoredRouting:
    call_id: str
    idx: int
    source: str
    dtype: str
    shape: tuple[int, ...]
    base: Key | None
    base_rows: int
    data: bytes
    """Rows from `base_rows` on."""

    def own(self) -> RoutingArray:
        rows = np.frombuffer(self.data, dtype=np.dtype(self.dtype).newbyteorder("<"))
        return rows.reshape(-1, *self.shape[1:])


def dtype_name(array: RoutingArray) -> str:
    name = array.dtype.name
    if name not in DTYPES:
        raise ValueError(f"routed experts of dtype {name}; store one of {DTYPES}")
    return name


def rebuild(stored: Mapping[Key, StoredRouting], key: Key) -> RoutingArray:
    """The whole array of `key`, from its own rows and its base chain's (O(rows) memory)."""
    top = stored[key]
    parts: list[RoutingArray] = [top.own()]
    need, at = top.base_rows, top.base
    while need > 0:
        if at is None or at not in stored:
            raise ValueError(f"routed experts of {key[0]} lost their base rows")
        row = stored[at]
        own = row.own()
        if need > row.base_rows:
            parts.append(own[: need - row.base_rows])
        need, at = min(need, row.base_rows), row.base
    parts.reverse()
    whole = np.concatenate(parts) if len(parts) > 1 else parts[0]
    if whole.shape != top.shape:
        raise ValueError(f"routed experts of {key[0]} rebuilt as {whole.shape}, not {top.shape}")
    return whole


def common_rows(a: RoutingArray, b: RoutingArray) -> int:
    """How many leading rows the two arrays share byte for byte (0 if their rows differ in
    shape or dtype)."""
    if a.dtype != b.dtype or a.shape[1:] != b.shape[1:]:
        return 0
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differs = (a[:n] != b[:n]).reshape(n, -1).any(axis=1)
    first = int(np.argmax(differs))
    return n if not differs[first] else first


class RecentRouting:
    """The writer's memory of each active rollout's latest routed call, bounded in bytes: a new
    call's rows are stored after the prefix it shares with it."""

    def __init__(self, max_bytes: int = 512 * 1024 * 1024) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._by_rollout: OrderedDict[str, dict[int, tuple[str, RoutingArray]]] = OrderedDict()

    def latest(self, rollout_id: str) -> dict[int, tuple[str, RoutingArray]]:
        found = self._by_rollout.get(rollout_id)
        if found is None:
            return {}
        self._by_rollout.move_to_end(rollout_id)
        return found

    def put(self, rollout_id: str, choices: dict[int, tuple[str, RoutingArray]]) -> None:
        self.forget(rollout_id)
        self._by_rollout[rollout_id] = choices
        self._bytes += _nbytes(choices)
        while self._bytes > self._max_bytes and self._by_rollout:
            _, evicted = self._by_rollout.popitem(last=False)
            self._bytes -= _nbytes(evicted)

    def forget(self, rollout_id: str) -> None:
        evicted = self._by_rollout.pop(rollout_id, None)
        if evicted:
            self._bytes -= _nbytes(evicted)


def _nbytes(choices: dict[int, tuple[str, RoutingArray]]) -> int:
    return sum(array.nbytes for _, array in choices.values())


def stage(
    call_id: str,
    rollout_id: str,
    source: str,
    routing: Mapping[int, RoutingArray],
    previous: Mapping[int, tuple[str, RoutingArray]],
) -> list[dict[str, Any]]:
    """The table rows of one call's routed experts, each after the longest prefix it shares
    with a choice of the previous routed call."""
    rows = []
    for idx, array in sorted(routing.items()):
        base: Key | None = None
        shared = 0
        for prev_idx, (prev_call, prev) in previous.items():
            n = common_rows(array, prev)
            if n > shared:
                base, shared = (prev_call, prev_idx), n
        rows.append(
            {
                "call_id": call_id,
                "idx": idx,
                "rollout_id": rollout_id,
                "source": source,
                "dtype": dtype_name(array),
                "shape": list(array.shape),
                "base_call_id": None if base is None else base[0],
                "base_idx": None if base is None else base[1],
                "base_rows": shared,
                "data": np.ascontiguousarray(array[shared:]).tobytes(),
            }
        )
    return rows


def _select(rollout_ids: Sequence[str]) -> Select[Any]:
    columns = ("call_id", "idx", "source", "dtype", "shape", "base_call_id", "base_idx")
    return select(*(RE.c[c] for c in columns), RE.c.base_rows, RE.c.data).where(
        RE.c.rollout_id.in_(rollout_ids)
    )


async def load(conn: AsyncConnection, rollout_ids: Sequence[str]) -> dict[Key, StoredRouting]:
    """Every stored routing row of these rollouts."""
    rows = await conn.execute(_select(rollout_ids))
    return {(r.call_id, r.idx): _stored(r) for r in rows}


def rollout_routing(conn: Connection, rollout_id: str) -> dict[Key, RoutingArray]:
    """Every routed call choice of the rollout, whole (a store.queries-style reader)."""
    stored = {(r.call_id, r.idx): _stored(r) for r in conn.execute(_select([rollout_id]))}
    return {key: rebuild(stored, key) for key in stored}


def _stored(r: Any) -> StoredRouting:
    base = None if r.base_call_id is None else (r.base_call_id, r.base_idx or 0)
    shape = tuple(int(n) for n in r.shape)
    return StoredRouting(
        r.call_id, r.idx, r.source, r.dtype, shape, base, r.base_rows, bytes(r.data)
    )


def for_sequence(
    stored: Mapping[Key, StoredRouting], last: Key, length: int
) -> RoutingArray | None:
    """The rows of a sequence of `length` tokens that ends with `last`'s answer: its
    `length - 1` rows, or None when that call choice has none (or not that many)."""
    if last not in stored:
        return None
    array = rebuild(stored, last)
    return array if len(array) == length - 1 else None


def as_json(array: RoutingArray | None) -> dict[str, Any] | None:
    """{dtype, shape, data: base64 of the C-order little-endian bytes} (JSON, wire, ATIF)."""
    if array is None:
        return None
    data = base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")
    return {"dtype": dtype_name(array), "shape": list(array.shape), "data": data}


def from_json(value: Mapping[str, Any] | None) -> RoutingArray | None:
    if value is None:
        return None
    dtype = np.dtype(str(value["dtype"])).newbyteorder("<")
    flat = np.frombuffer(base64.b64decode(value["data"]), dtype=dtype)
    return flat.reshape([int(n) for n in value["shape"]])


def stored_bytes(rows: Iterable[StoredRouting]) -> int:
    return sum(len(r.data) for r in rows)
