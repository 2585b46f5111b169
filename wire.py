"""How trajectories travel from the rollout service to a trainer: the one wire format that the
service encodes (rolltap.runner.service) and `rolltap.client` decodes.

A trajectory is a row of named fields (the names of `rolltap.analysis.trajectory.Trajectory`).
Two encodings:

* ``base64`` (JSON): token arrays as base64 of their little-endian bytes: ``prompt_ids`` and
  ``response_ids`` int32, ``loss_mask`` uint8, ``logprobs`` float32; everything else plain JSON
  (``turns`` as a list of {kind, start, end, call_id, weight_version, token_hash}), and
  ``routed_experts`` (MoE routing replay, rolltap.store.routed) as {dtype, shape, data: base64
  of the C-order little-endian bytes} or null; ``weight_spans`` as [[version, start, end], ...].
* ``arrow``: an Arrow IPC stream, one row per trajectory, the arrays as list<int32>, list<uint8>,
  list<float32> columns and ``turns`` as parallel ``turn_*`` list columns, ``routed_experts`` as
  binary with ``routed_experts_dtype`` and ``routed_experts_shape``, ``weight_spans`` as its
  JSON text; in JSON messages (SSE) the
  stream is carried base64-encoded.

Either way the decoded row holds numpy arrays that view the received bytes (no per-token
Python objects), so a trainer pays for the arrays once.
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

ENCODINGS = ("base64", "arrow")
ARRAYS: dict[str, np.dtype[Any]] = {
    "prompt_ids": np.dtype("<i4"),
    "response_ids": np.dtype("<i4"),
    "loss_mask": np.dtype("u1"),
    "logprobs": np.dtype("<f4"),
}
"""The token-aligned arrays of a trajectory and their wire dtypes."""
SCALARS = (
    "rollout_id",
    "segment",
    "role",
    "has_logprobs",
    "finish_reason",
    "sampled_tokens",
    "lost_tokens",
    "prompt_hash",
    "min_version",
    "max_version",
)
LISTS = ("call_ids", "weight_versions")
TURN_FIELDS = ("kind", "start", "end", "call_id", "weight_version", "token_hash")

Row = dict[str, Any]


def pack(array: npt.NDArray[Any], dtype: np.dtype[Any]) -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype=dtype).tobytes()).decode("ascii")


def unpack(text: str, dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    return np.frombuffer(base64.b64decode(text), dtype=dtype)


def row_to_json(row: Row) -> Row:
    """A trajectory row with its arrays packed as base64 (the ``base64`` encoding)."""
    out = dict(row)
    for name, dtype in ARRAYS.items():
        out[name] = pack(row[name], dtype)
    routing = row.get("routed_experts")
    out["routed_experts"] = None if routing is None else _routing_json(routing)
    return out


def row_from_json(data: Row) -> Row:
    out = dict(data)
    for name, dtype in ARRAYS.items():
        out[name] = unpack(data[name], dtype)
    routing = data.get("routed_experts")
    out["routed_experts"] = None if routing is None else _routing_array(routing)
    return out


def _routing_bytes(array: npt.NDArray[Any]) -> bytes:
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()


def _routing_json(array: npt.NDArray[Any]) -> dict[str, Any]:
    data = base64.b64encode(_routing_bytes(array)).decode("ascii")
    return {"dtype": array.dtype.name, "shape": list(array.shape), "data": data}


def _routing_array(value: dict[str, Any]) -> npt.NDArray[Any]:
    return _routing(base64.b64decode(value["data"]), value["dtype"], value["shape"])


def _routing(data: bytes, dtype: str, shape: Sequence[int]) -> npt.NDArray[Any]:
    flat = np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<"))
    return flat.reshape([int(n) for n in shape])


def rows_to_arrow(rows: Sequence[Row]) -> bytes:
    """Rows as one Arrow IPC stream (the ``arrow`` encoding)."""
    import pyarrow as pa

    columns: dict[str, Any] = {}
    for name, dtype in ARRAYS.items():
        columns[name] = _list_column([r[name] for r in rows], dtype)
    types = _scalar_types()
    for name in SCALARS:
        columns[name] = pa.array([r[name] for r in rows], type=types[name])
    for name in LISTS:
        columns[name] = pa.array([list(r[name]) for r in rows], type=pa.list_(pa.string()))
    turns = [t for r in rows for t in r["turns"]]
    offsets = pa.array(_offsets([len(r["turns"]) for r in rows]))
    for field in TURN_FIELDS:
        if field in ("start", "end"):
            flat = pa.array(np.fromiter((t[field] for t in turns), np.int32, len(turns)))
        else:
            flat = pa.array([t[field] for t in turns], type=pa.string())
        columns[f"turn_{field}"] = pa.ListArray.from_arrays(offsets, flat)
    columns["link"] = pa.array(
        [None if r["link"] is None else orjson.dumps(r["link"]).decode() for r in rows],
        type=pa.string(),
    )
    columns["weight_spans"] = pa.array(
        [orjson.dumps(r.get("weight_spans") or []).decode() for r in rows], type=pa.string()
    )
    routings = [r.get("routed_experts") for r in rows]
    columns["routed_experts"] = pa.array(
        [None if a is None else _routing_bytes(a) for a in routings], type=pa.binary()
    )
    columns["routed_experts_dtype"] = pa.array(
        [None if a is None else a.dtype.name for a in routings], type=pa.string()
    )
    columns["routed_experts_shape"] = pa.array(
        [None if a is None else list(a.shape) for a in routings], type=pa.list_(pa.int32())
    )
    table = pa.table(columns)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def rows_from_arrow(blob: bytes) -> list[Row]:
    import pyarrow as pa

    table = pa.ipc.open_stream(pa.py_buffer(blob)).read_all()
    n = table.num_rows
    rows: list[Row] = [{} for _ in range(n)]
    for name, dtype in ARRAYS.items():
        for row, array in zip(rows, _list_values(table.column(name), dtype), strict=True):
            row[name] = array
    for name in (*SCALARS, *LISTS):
        for row, value in zip(rows, table.column(name).to_pylist(), strict=True):
            row[name] = value
    bounds = _row_bounds(table.column("turn_kind"))
    flat = {f: table.column(f"turn_{f}").combine_chunks().values.to_pylist() for f in TURN_FIELDS}
    for row, (lo, hi) in zip(rows, bounds, strict=True):
        row["turns"] = [{f: flat[f][k] for f in TURN_FIELDS} for k in range(lo, hi)]
    for row, link in zip(rows, table.column("link").to_pylist(), strict=True):
        row["link"] = None if link is None else orjson.loads(link)
    if "weight_spans" in table.column_names:
        for row, spans in zip(rows, table.column("weight_spans").to_pylist(), strict=True):
            row["weight_spans"] = orjson.loads(spans)
    if "routed_experts" in table.column_names:
        routing = zip(
            table.column("routed_experts").to_pylist(),
            table.column("routed_experts_dtype").to_pylist(),
            table.column("routed_experts_shape").to_pylist(),
            strict=True,
        )
        for row, (data, dtype, shape) in zip(rows, routing, strict=True):
            row["routed_experts"] = None if data is None else _routing(data, dtype, shape)
    return rows


def _offsets(lengths: Sequence[int]) -> npt.NDArray[np.int32]:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(np.asarray(lengths, dtype=np.int32), out=offsets[1:])
    return offsets


def _row_bounds(column: Any) -> list[tuple[int, int]]:
    """(start, end) of each row's values in a list column's flattened values."""
    offsets = column.combine_chunks().offsets.to_numpy(zero_copy_only=False)
    return [(int(a), int(b)) for a, b in itertools.pairwise(offsets)]


def _list_column(arrays: Sequence[npt.NDArray[Any]], dtype: np.dtype[Any]) -> Any:
    """list<dtype> from numpy arrays in one copy: their concatenation plus offsets."""
    import pyarrow as pa

    offsets = _offsets([len(a) for a in arrays])
    flat = np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))


def _list_values(column: Any, dtype: np.dtype[Any]) -> list[npt.NDArray[Any]]:
    """Each row's values of a list column as numpy views of the received buffer."""
    out: list[npt.NDArray[Any]] = []
    for chunk in column.chunks:
        offsets = chunk.offsets.to_numpy(zero_copy_only=False)
        values = chunk.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
        out.extend(values[offsets[i] : offsets[i + 1]] for i in range(len(chunk)))
    return out


def _scalar_types() -> dict[str, Any]:
    import pyarrow as pa

    text = pa.string()
    return {
        "rollout_id": text,
        "segment": pa.int32(),
        "role": text,
        "has_logprobs": pa.bool_(),
        "finish_reason": text,
        "sampled_tokens": pa.int32(),
        "lost_tokens": pa.int32(),
        "prompt_hash": text,
        "min_version": text,
        "max_version": text,
    }
