"""One rollout, analysed for its page: segments, token layout, drift breaks and their diffs.

The analysis is what `rolltap show` computes (analysis/reading.py `rollout_trajectories`, with
the viewer's tokenizer when it has one, so breaks are also judged on text). Token strips load one
call at a time, so the last few analyses are kept, keyed by what would change them (calls,
status).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..analysis.drift import DetokenizeFailed, Drift
from ..analysis.reading import rollout_trajectories
from ..analysis.segments import SegmentRole
from ..analysis.trajectory import Faithfulness, RolloutTrajectories, Trajectory
from ..store import CallView, RolloutView, Store
from ..store.models import LinkKind
from ..store.packing import IdArray
from .conversation import Exchange
from .diff import Piece, turn_text, word_diff
from .layout import Layout, SegmentTokens, lay_out
from .tokens import TokenTexts

KEEP = 8
"""Analyses kept for token strip requests."""
AROUND = 10
"""Tokens shown on each side of a break's first differing token."""


@dataclass(frozen=True)
class Analysis:
    built: RolloutTrajectories
    layout: Layout
    failure: str | None = None
    """Why the token records could not be assembled (they contradict each other)."""

    def segment(self, index: int) -> SegmentTokens:
        return self.layout.segments[index]

    def started_by(self) -> dict[str, Trajectory]:
        """Each call that opened a segment, with that segment (its line, not its siblings)."""
        opened: dict[str, Trajectory] = {}
        for t in self.built.trajectories:
            if t.role is not SegmentRole.SIBLING:
                opened.setdefault(t.call_ids[0], t)
        return opened


class Analyses:
    def __init__(self) -> None:
        self._kept: OrderedDict[tuple[object, ...], Analysis] = OrderedDict()
        self._lock = asyncio.Lock()

    async def get(
        self, store: Store, view: RolloutView, calls: list[CallView], texts: TokenTexts | None
    ) -> Analysis:
        key = (view.id, len(calls), view.status, view.finished_at, texts is not None)
        async with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return self._kept[key]
            detokenizer = None if texts is None else texts.detokenizer
            try:
                built = await rollout_trajectories(store, view.id, detokenizer=detokenizer)
            except ValueError as e:
                # Records edited behind the store's back (ids and logprobs of different
                # lengths) cannot be assembled; the page still shows everything else.
                analysis = _unassembled(view, str(e))
            else:
                analysis = Analysis(built, lay_out(built, {c.id: c.prompt_tokens for c in calls}))
            self._kept[key] = analysis
            while len(self._kept) > KEEP:
                self._kept.popitem(last=False)
            return analysis


def _unassembled(view: RolloutView, why: str) -> Analysis:
    nothing = Faithfulness(0, 0, {}, 0, 0, 0, 0, 0)
    built = RolloutTrajectories(view, [], nothing, [], [], {}, 0)
    return Analysis(built, Layout({}, {}), why)


@dataclass(frozen=True)
class TokenDiff:
    """The tokens around a break's first differing position, in the parent and the new prompt."""

    position: int
    was: list[str]
    now: list[str]
    first: int
    """Index in `was`/`now` of the first differing token."""


@dataclass(frozen=True)
class Break:
    trajectory: Trajectory
    drift: Drift
    seq: int
    """The call whose prompt broke the chain."""
    parent_seq: int
    region_seq: int
    messages: list[Piece] | None
    """A word diff of the first changed message, when messages decided the class."""
    text: list[Piece] | None
    """A word diff of the decoded diverging text, when a tokenizer was at hand."""
    tokens: TokenDiff | None


async def breaks(
    analysis: Analysis, exchanges: dict[str, Exchange], texts: TokenTexts | None
) -> list[Break]:
    built = analysis.built
    found = []
    for t in built.trajectories:
        link = t.link
        if link is None or link.kind is not LinkKind.BREAK or link.drift is None:
            continue
        drift = link.drift
        text = None
        if drift.parent_text is not None and drift.child_text is not None:
            text = word_diff(drift.parent_text, drift.child_text)
        found.append(
            Break(
                t,
                drift,
                built.seqs.get(t.call_ids[0], 0),
                built.seqs.get(link.call_id, 0),
                built.seqs.get(drift.region_call, 0),
                _message_diff(drift, exchanges, t.call_ids[0]),
                text,
                await _token_diff(analysis.segment(link.parent_segment), t, link.position, texts),
            )
        )
    return found


def _message_diff(drift: Drift, exchanges: dict[str, Exchange], call_id: str) -> list[Piece] | None:
    if drift.evidence != "messages" or drift.message_index is None:
        return None
    child, parent = exchanges.get(call_id), exchanges.get(drift.parent_call)
    if child is None or parent is None or child.sent is None or parent.sent is None:
        return None
    choice = drift.parent_choice or 0
    before = parent.sent + (parent.answers[choice] if choice < len(parent.answers) else [])
    i = drift.message_index
    old = before[i] if i < len(before) else None
    new = child.sent[i] if i < len(child.sent) else None
    return word_diff(turn_text(old), turn_text(new))


async def _token_diff(
    parent: SegmentTokens, child: Trajectory, position: int, texts: TokenTexts | None
) -> TokenDiff:
    lo = max(0, position - AROUND)
    was = parent.ids[lo : position + AROUND]
    now = np.concatenate([child.prompt_ids, child.response_ids])[lo : position + AROUND]
    return TokenDiff(position, await _texts(was, texts), await _texts(now, texts), position - lo)


async def _texts(ids: IdArray, texts: TokenTexts | None) -> list[str]:
    values = [int(i) for i in ids]
    if texts is not None:
        with contextlib.suppress(DetokenizeFailed):
            return await texts.texts(values)
    return [str(i) for i in values]
