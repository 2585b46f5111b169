"""A rollout's call rows as the store returns them, and the rollouts whose calls run in one line.

Most rollouts are one line: every call succeeded, was captured with tokens, sampled one choice on
the main line, was not retried, and was stored as the previous call's sequence (its prompt and
the choice it sampled) plus a suffix. Assembly (segments.py) makes such a rollout one segment
whatever else it holds: each call extends the last one's tail, which the stored reference proves
without comparing a token. So its sequence is the first prompt, then each call's completion and
the next call's suffix, in order: one concatenation per rollout, where assembly rebuilds every
prompt (O(calls^2) tokens) and makes an object for every call and choice. An export is mostly
such rollouts, so it spends per rollout here, not per call (bench/export_bench.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..store.models import CallStatus, Capture, call_table, choice_table
from ..store.packing import IDS, LOGPROBS
from .segments import SegmentArrays

C = call_table
CH = choice_table

CALL_COLUMNS = (
    C.c.id,
    C.c.rollout_id,
    C.c.seq,
    C.c.dialect,
    C.c.purpose,
    C.c.status,
    C.c.capture,
    C.c.retry_of,
    C.c.retry_count,
    C.c.body_hash,
    C.c.weight_version,
    C.c.prompt_parent_id,
    C.c.prompt_parent_choice,
    C.c.prompt_shared,
    C.c.prompt_suffix,
    C.c.weight_spans,
)
"""A call row, read by position (by name costs more than the rest of a call's handling)."""
CHOICE_COLUMNS = (CH.c.call_id, CH.c.idx, CH.c.finish_reason, CH.c.token_ids, CH.c.logprobs)

Row = Sequence[Any]
_OK = CallStatus.OK.value
_TOKENS = Capture.TOKENS.value
_MAIN = (None, "main", "")
_ITEM = IDS.itemsize
"""Bytes per packed id and per packed logprob."""


@dataclass(frozen=True)
class Line:
    """A one-line rollout: its calls, in order, and its one segment's arrays."""

    call_ids: tuple[str, ...]
    seqs: tuple[int, ...]
    weight_versions: tuple[str | None, ...]
    weight_spans: tuple[list[list[Any]] | None, ...]
    """Per call, its choice's spans where more than one version sampled it (WeightSpans)."""
    last_choice: int
    finish_reason: str | None
    arrays: SegmentArrays


def line_of(calls: Sequence[Row], choices: Mapping[str, Sequence[Row]]) -> Line | None:
    """The rollout of these call rows (in seq order) as a line, or None when it is not one."""
    # The packed blobs are joined as they are (store/packing.py: 4-byte little-endian items),
    # so a line makes its numpy arrays once, not per call.
    blobs: list[bytes] = []
    scores: list[bytes | None] = []
    previous: str | None = None
    previous_choice = 0
    length = 0
    for (
        call_id,
        _rollout,
        _seq,
        _dialect,
        purpose,
        status,
        capture,
        retry_of,
        retry_count,
        _body_hash,
        _version,
        parent,
        parent_choice,
        shared,
        suffix,
        _spans,
    ) in calls:
        rows = choices.get(call_id, ())
        if (
            status != _OK
            or capture != _TOKENS
            or purpose not in _MAIN
            or retry_of is not None
            or retry_count
            or len(rows) != 1
            or parent != previous
            or (parent is not None and (parent_choice != previous_choice or shared != length))
            or (parent is None and suffix is None)
        ):
            return None
        _, index, finish, sampled, logprobs = rows[0]
        added, sampled = suffix or b"", sampled or b""
        if (len(added) | len(sampled)) % _ITEM or (
            logprobs is not None and len(logprobs) != len(sampled)
        ):
            return None  # left to assembly, which refuses it as it always did
        blobs += (added, sampled)
        scores.append(logprobs)
        length += (len(added) + len(sampled)) // _ITEM
        previous, previous_choice = call_id, index
    if previous is None:
        return None
    return Line(
        tuple(row[0] for row in calls),
        tuple(row[2] for row in calls),
        tuple(row[10] for row in calls),
        tuple(choice_spans(row[15], choices[row[0]][0][1]) for row in calls),
        previous_choice,
        finish,
        _arrays(blobs, scores),
    )


def choice_spans(stored: dict[str, Any] | None, choice: int) -> list[list[Any]] | None:
    """One choice's spans from a call's `weight_spans` (None: one version sampled it)."""
    if not stored:
        return None
    found = stored.get(str(choice))
    return found if isinstance(found, list) else None


def _arrays(blobs: list[bytes], scores: list[bytes | None]) -> SegmentArrays:
    """The segment's arrays as Segment.arrays makes them (writable, like its): mask 1 and the
    engine's logprobs on each completion (NaN where it gave none), 0 elsewhere."""
    lengths = [len(b) // _ITEM for b in blobs]
    ends = np.cumsum(lengths).tolist()
    sampled = np.zeros(len(blobs), dtype=np.int8)
    sampled[1::2] = 1
    mask = np.repeat(sampled, lengths)
    given = [
        np.full(n, np.nan, LOGPROBS).tobytes() if lp is None else lp
        for lp, n in zip(scores, lengths[1::2], strict=True)
    ]
    logprobs = np.zeros(len(mask), dtype=LOGPROBS)
    logprobs[mask.view(np.bool_)] = np.frombuffer(b"".join(given), dtype=LOGPROBS)
    return SegmentArrays(
        ids=np.frombuffer(bytearray().join(blobs), dtype=IDS),
        mask=mask,
        logprobs=logprobs,
        prompt_len=lengths[0],
        has_logprobs=all(lp is not None for lp in scores),
        lost_tokens=0,
        answers=tuple(zip(ends[0::2], ends[1::2], strict=True)),
    )
