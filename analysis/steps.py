"""Step structure of a trajectory: where each answer and each observation sits in its tokens.

Step-level methods (per-turn advantages, GiGPO's anchor states) need to know which tokens each
call sampled and which came back from the environment between two calls, without parsing any
text. Assembly already knows: a segment's pieces are its calls, each sampled span starts at its
call's prompt length, and whatever lies between one piece's end and the next piece's start is
what the model did not sample (a tool result, a user turn, template glue). An observation's hash
is over its token ids alone (little-endian int32, blake2b-64), so equal observations hash equal
across rollouts, processes and machines: a trainer groups steps by it with no tokenizer.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..store.packing import IDS, IdArray


class TurnKind(enum.StrEnum):
    ANSWER = "answer"
    """Tokens one call sampled (loss mask 1)."""
    OBSERVATION = "observation"
    """Tokens between two answers that the model did not sample (loss mask 0)."""


@dataclass(frozen=True)
class TurnSpan:
    """One turn of a trajectory, as a half-open span [start, end) of its `response_ids`."""

    kind: TurnKind
    start: int
    end: int
    call_id: str | None = None
    """The call that sampled an answer; None for an observation."""
    weight_version: str | None = None
    """The policy version an answer was sampled with."""
    token_hash: str | None = None
    """An observation's stable hash (`token_hash`); None for an answer."""

    def as_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind.value,
            "start": self.start,
            "end": self.end,
            "call_id": self.call_id,
            "weight_version": self.weight_version,
            "token_hash": self.token_hash,
        }


def token_hash(ids: IdArray) -> str:
    """A stable 16-hex-digit hash of token ids: blake2b-64 of their little-endian int32 bytes."""
    packed = np.ascontiguousarray(ids, dtype=IDS).tobytes()
    return hashlib.blake2b(packed, digest_size=8).hexdigest()


def turn_spans(
    response_ids: IdArray,
    answers: Sequence[tuple[int, int]],
    call_ids: Sequence[str],
    versions: Sequence[str | None],
) -> tuple[TurnSpan, ...]:
    """The answers and observations of a trajectory: `answers` holds each merged call's sampled
    span [start, end) of `response_ids`, `call_ids` and `versions` the call's id and weight
    version. An answer resumed after a weight update follows its first part with no observation
    between them: empty observations are left out."""
    spans: list[TurnSpan] = []
    previous_end = 0
    for (start, end), call_id, version in zip(answers, call_ids, versions, strict=True):
        if start > previous_end:
            between = response_ids[previous_end:start]
            spans.append(
                TurnSpan(TurnKind.OBSERVATION, previous_end, start, token_hash=token_hash(between))
            )
        spans.append(TurnSpan(TurnKind.ANSWER, start, end, call_id, version))
        previous_end = end
    return tuple(spans)


def version_range(versions: Sequence[str | None]) -> tuple[str | None, str | None]:
    """(oldest, newest) of the versions calls were sampled with, in the order they were sampled:
    weights only move forward in time, so the first version seen is the oldest whatever the
    labels look like ("10" sorts before "9" as text)."""
    known = [v for v in versions if v is not None]
    if not known:
        return None, None
    return known[0], known[-1]
