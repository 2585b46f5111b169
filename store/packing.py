"""Token ids and logprobs as packed little-endian arrays, validated on the way in."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import InvalidTokens

IDS = np.dtype("<i4")
LOGPROBS = np.dtype("<f4")
_INT32_MAX = 2**31 - 1
# Logprobs are log-probabilities; float noise from a log-softmax can land a hair above zero.
_LOGPROB_CEILING = 1e-3

IdArray = npt.NDArray[np.int32]
LogprobArray = npt.NDArray[np.float32]
RoutingArray = npt.NDArray[np.integer[Any]]
"""Routed experts (store/routed.py): uint8, uint16 or int32, tokens x layers [x top-k]."""


def id_list(values: Sequence[int]) -> npt.NDArray[Any]:
    """`values` as `np.asarray(values)` reads them, faster for the usual list of ints: `struct`
    packs them in one C pass (each through `__index__`, so floats and strings are refused there
    too; a third of the instructions of `array('q')`, whose per-item argument parsing dominates
    a 2,000-id prompt), where numpy discovers a dtype element by element; anything else goes to
    numpy."""
    # A leading bool: numpy makes a list of bools a bool array (refused as ids), not ints.
    if type(values) is list and values and type(values[0]) is not bool:
        try:
            return np.frombuffer(struct.pack(f"<{len(values)}q", *values), dtype="<i8")
        except struct.error:
            pass
    return np.asarray(values)


def logprob_list(values: Sequence[float]) -> npt.NDArray[np.float64]:
    """`values` as `np.asarray(values, dtype=np.float64)` reads them, by the same C path."""
    if type(values) is list:
        try:
            return np.frombuffer(struct.pack(f"<{len(values)}d", *values), dtype="<f8")
        except struct.error:
            pass
    return np.asarray(values, dtype=np.float64)


def as_ids(values: Sequence[int] | npt.NDArray[np.integer]) -> IdArray:
    """Token ids as an int32 array; refuses negatives and ids that do not fit in int32."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise InvalidTokens(f"token ids must be a flat list, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=IDS)
    if arr.dtype.kind not in "iu":  # np.issubdtype's Python costs more than the check below
        raise InvalidTokens(f"token ids must be integers, got {arr.dtype}")
    # One pass where two would do: read as unsigned, a negative id is larger than any valid one.
    if arr.dtype == np.int64 and int(arr.view(np.uint64).max()) <= _INT32_MAX:
        return arr.astype(IDS)
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi > _INT32_MAX:
        raise InvalidTokens(f"token ids must lie in [0, 2^31), got range [{lo}, {hi}]")
    return arr.astype(IDS, copy=False)


def as_logprobs(values: Sequence[float] | npt.NDArray[np.floating]) -> LogprobArray:
    """Logprobs as a float32 array; refuses NaN, +inf and positive values (-inf is log 0)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise InvalidTokens(f"logprobs must be a flat list, got shape {arr.shape}")
    if (arr <= _LOGPROB_CEILING).all():  # one pass: NaN is not <= anything either
        return arr.astype(LOGPROBS)
    if np.isnan(arr).any():
        raise InvalidTokens(f"logprobs contain NaN at {int(np.flatnonzero(np.isnan(arr))[0])}")
    if (arr > _LOGPROB_CEILING).any():
        bad = int(np.flatnonzero(arr > _LOGPROB_CEILING)[0])
        raise InvalidTokens(f"logprob {arr[bad]} at {bad} is positive; logprobs are <= 0")
    return arr.astype(LOGPROBS)


def pack(arr: IdArray | LogprobArray) -> bytes:
    return arr.tobytes()


def unpack_ids(blob: bytes | None) -> IdArray:
    if not blob:
        return np.zeros(0, dtype=IDS)
    return np.frombuffer(blob, dtype=IDS)


def unpack_logprobs(blob: bytes | None) -> LogprobArray | None:
    if blob is None:
        return None
    return np.frombuffer(blob, dtype=LOGPROBS)
