"""Arrow arrays built from numpy buffers, the same arrays `pa.array` makes from Python values.

pyarrow's converters (`pa.array`, `Table.from_pylist`, `pa.scalar`) first ask whether their input
is a pandas object, which imports pandas, once per process, wherever it is installed: 0.2 to
0.4 CPU-s, as much as all the rest of a Parquet export of 4.8 M tokens (bench/export_bench.py).
`Array.from_buffers` asks nothing, so an export builds every column through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa


def flat(values: npt.NDArray[Any], type_: pa.DataType) -> pa.Array:
    """A numpy array of numbers as a null-free Arrow array of `type_` (cast when they differ)."""
    data = np.ascontiguousarray(values, dtype=type_.to_pandas_dtype())
    return pa.Array.from_buffers(type_, len(data), [None, pa.py_buffer(data)])


def lists(arrays: Sequence[npt.NDArray[Any]], type_: pa.ListType) -> pa.Array:
    """numpy arrays as one null-free list array: their values joined, offsets between them."""
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum(
        np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays)), out=offsets[1:]
    )
    values = np.concatenate(arrays) if arrays else np.zeros(0)
    child = flat(values, type_.value_type)
    buffers = [None, pa.py_buffer(offsets)]
    return pa.Array.from_buffers(type_, len(arrays), buffers, children=[child])


def column(values: Sequence[Any], type_: pa.DataType) -> pa.Array:
    """`pa.array(values, type=type_)` for numbers, booleans, strings, bytes, structs (dicts) and
    lists of them; None is null."""
    n = len(values)
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=n)
    nulls = n - int(np.count_nonzero(valid))
    validity = None if nulls == 0 else pa.py_buffer(np.packbits(valid, bitorder="little"))
    if pa.types.is_list(type_):
        lengths = np.fromiter((0 if v is None else len(v) for v in values), np.int64, count=n)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        child = column([x for v in values if v is not None for x in v], type_.value_type)
        buffers = [validity, pa.py_buffer(offsets)]
        return pa.Array.from_buffers(type_, n, buffers, null_count=nulls, children=[child])
    if pa.types.is_struct(type_):
        fields = [type_.field(i) for i in range(type_.num_fields)]
        children = [
            column([None if v is None else v[f.name] for v in values], f.type) for f in fields
        ]
        mask = None if nulls == 0 else pa.array(~valid)
        return pa.StructArray.from_arrays(children, fields=fields, mask=mask)
    if pa.types.is_string(type_) or pa.types.is_binary(type_):
        encoded = [b"" if v is None else v.encode() if isinstance(v, str) else v for v in values]
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(np.fromiter(map(len, encoded), np.int64, count=n), out=offsets[1:])
        buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
        return pa.Array.from_buffers(type_, n, buffers, null_count=nulls)
    if pa.types.is_boolean(type_):
        bits = np.fromiter((v is not None and bool(v) for v in values), dtype=bool, count=n)
        data = pa.py_buffer(np.packbits(bits, bitorder="little"))
    else:
        dtype = type_.to_pandas_dtype()
        data = pa.py_buffer(np.fromiter((0 if v is None else v for v in values), dtype, count=n))
    return pa.Array.from_buffers(type_, n, [validity, data], null_count=nulls)
