"""Where each call's tokens lie in a rollout's segments: what a token strip shows for a call.

A segment (a `Trajectory`) is one token sequence: the first call's prompt, then for every merged
call the tokens the harness added (mask 0) and the tokens the model sampled (mask 1). A call's
strip is its stretch of that sequence: from the end of the previous answer (or, for the first
call, from the start of what the segment does not share with its parent) to the end of its own
answer. Positions where a later segment branched off are marks; sampled tokens that a break did
not carry over are lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..analysis.segments import MaskArray, SegmentRole
from ..analysis.trajectory import RolloutTrajectories, Trajectory
from ..store.models import LinkKind
from ..store.packing import IdArray, LogprobArray


@dataclass(frozen=True)
class Span:
    """One call's stretch of a segment: context [context_start, start), sampled [start, end)."""

    segment: int
    call_id: str
    context_start: int
    start: int
    end: int


@dataclass(frozen=True)
class Mark:
    """A later segment branched off here: a drift break, a side call or another choice."""

    position: int
    segment: int
    kind: str
    """The drift class of a break, else the link kind (side, sibling)."""


@dataclass(frozen=True)
class SegmentTokens:
    trajectory: Trajectory
    ids: IdArray
    mask: MaskArray
    """Over the whole sequence: 0 on the prompt and on added context, 1 on sampled tokens."""
    logprobs: LogprobArray
    lost: npt.NDArray[np.bool_]
    marks: tuple[Mark, ...]
    spans: tuple[Span, ...]


@dataclass(frozen=True)
class Layout:
    segments: dict[int, SegmentTokens]
    home: dict[str, Span]
    """The span each call's tokens are shown in: the first segment that merged the call."""

    def span(self, call_id: str) -> Span | None:
        return self.home.get(call_id)


def lay_out(built: RolloutTrajectories, prompt_lengths: Mapping[str, int]) -> Layout:
    """`prompt_lengths`: each token-faithful call's prompt length (CallView.prompt_tokens)."""
    spans = {t.segment: _spans(t, prompt_lengths) for t in built.trajectories}
    segments: dict[int, SegmentTokens] = {}
    for t in built.trajectories:
        ids = np.concatenate([t.prompt_ids, t.response_ids])
        mask = np.concatenate([np.zeros(len(t.prompt_ids), dtype=np.int8), t.loss_mask])
        logprobs = np.concatenate([np.zeros(len(t.prompt_ids), dtype=t.logprobs.dtype), t.logprobs])
        children = [c for c in built.trajectories if c.link and c.link.parent_segment == t.segment]
        lost = np.zeros(len(ids), dtype=bool)
        marks: list[Mark] = []
        for child in children:
            link = child.link
            assert link is not None
            kind = link.drift.kind.value if link.drift is not None else link.kind.value
            marks.append(Mark(link.position, child.segment, kind))
            if link.kind is LinkKind.BREAK:
                parent_span = _find(spans[t.segment], link.call_id)
                end = link.position if parent_span is None else parent_span.end
                lost[link.position : end] |= mask[link.position : end] == 1
        segments[t.segment] = SegmentTokens(
            t,
            ids,
            mask,
            logprobs,
            lost,
            tuple(sorted(marks, key=lambda m: m.position)),
            spans[t.segment],
        )
    home: dict[str, Span] = {}
    for t in sorted(built.trajectories, key=lambda t: t.role is SegmentRole.SIBLING):
        for span in spans[t.segment]:
            home.setdefault(span.call_id, span)
    return Layout(segments, home)


def _spans(t: Trajectory, prompt_lengths: Mapping[str, int]) -> tuple[Span, ...]:
    mask = np.concatenate([np.zeros(len(t.prompt_ids), dtype=np.int8), t.loss_mask])
    n = len(mask)
    starts = [prompt_lengths.get(c, 0) for c in t.call_ids]
    if t.link is not None and t.link.kind is LinkKind.SIBLING:
        # Another choice of the call: its prompt is shown with the choice the line followed.
        first = starts[0]
    elif t.link is not None:
        first = min(t.link.position, starts[0])
    else:
        first = 0
    spans: list[Span] = []
    previous_end = first
    for i, (call_id, start) in enumerate(zip(t.call_ids, starts, strict=True)):
        limit = starts[i + 1] if i + 1 < len(starts) else n
        context = np.flatnonzero(mask[start:limit] == 0)
        end = start + int(context[0]) if context.size else limit
        spans.append(Span(t.segment, call_id, min(previous_end, start), start, end))
        previous_end = end
    return tuple(spans)


def _find(spans: tuple[Span, ...], call_id: str) -> Span | None:
    return next((s for s in spans if s.call_id == call_id), None)
