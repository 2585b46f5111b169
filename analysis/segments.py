"""Segment assembly: a rollout's calls merged into token-exact chains, with every break located.

A call whose prompt extends an earlier call's prompt plus the completion it sampled continues that
call's segment: the sampled ids get mask 1 and their logprobs, whatever the harness and template
put between turns (tool results, user turns, glue) gets mask 0. A call that extends nothing starts
a new segment linked to the earlier call it shares the longest prefix with, at the first differing
token. Side calls (a `purpose`, or a branch the main line carried on past) are linked segments of
their own; `n > 1` choices become sibling segments; superseded retries and failed calls are
skipped; text-only calls never join a segment and close the one they followed.

Everything here is pure: arrays in, arrays out; the only loops run over calls, never tokens.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ..store.delta import common_prefix
from ..store.models import CallStatus, Capture, LinkKind
from ..store.packing import IDS, LOGPROBS, IdArray, LogprobArray
from ..store.records import ChoiceTokens

MaskArray = npt.NDArray[np.int8]

SIDE_OVERLAP = 0.5
"""A new segment sharing less than this share of its own prompt with its parent, and never
continued, is a side call (a title, a one-off question) rather than the main line broken."""


class SegmentRole(enum.StrEnum):
    MAIN = "main"
    SIDE = "side"
    SIBLING = "sibling"


@dataclass(frozen=True)
class CallInput:
    """What assembly needs of one call, in the order the rollout made them."""

    id: str
    seq: int
    status: CallStatus = CallStatus.OK
    capture: Capture = Capture.TOKENS
    purpose: str | None = None
    retry_of: str | None = None
    retry_count: int = 0
    """The client's own count of earlier attempts (x-stainless-retry-count)."""
    body_hash: str | None = None
    prompt: IdArray | None = None
    choices: tuple[ChoiceTokens, ...] = ()
    stored_parent: tuple[str, int | None, int] | None = None
    """The store's delta reference (parent call, parent choice, shared length): a free proof
    that the prompt extends that sequence when the shared length covers all of it."""

    def choice(self, index: int) -> ChoiceTokens:
        if index < len(self.choices) and self.choices[index].index == index:
            return self.choices[index]  # the store keeps choices in index order
        for c in self.choices:
            if c.index == index:
                return c
        raise KeyError(index)


@dataclass
class Piece:
    """One call merged into a segment, with the choice the segment follows."""

    call: CallInput
    choice: int

    @property
    def start(self) -> int:
        """Where its sampled tokens begin in the segment: its prompt length."""
        assert self.call.prompt is not None
        return len(self.call.prompt)

    @property
    def sampled(self) -> ChoiceTokens:
        return self.call.choice(self.choice)

    @property
    def end(self) -> int:
        return self.start + len(self.sampled.token_ids)


@dataclass
class Link:
    kind: LinkKind
    parent_segment: int
    call_id: str
    """The earlier call the segment branched from."""
    choice: int | None
    """None: branched inside that call's prompt; k: after its prompt, in or after choice k."""
    position: int
    """Index of the first differing token (equal in the parent's sequence and the new prompt)."""
    after_text_call: str | None = None
    """A text-only call that closed the parent segment just before this one started."""


@dataclass
class Segment:
    index: int
    role: SegmentRole
    pieces: list[Piece]
    link: Link | None = None
    closed_by: str | None = None
    """The text-only call after which nothing may extend this segment."""
    lost: list[tuple[int, int]] = field(default_factory=list)
    """Ranges of this segment's sequence that a later break did not carry over verbatim."""

    @property
    def calls(self) -> list[str]:
        return [p.call.id for p in self.pieces]

    @property
    def first_seq(self) -> int:
        return self.pieces[0].call.seq

    @property
    def last_seq(self) -> int:
        return self.pieces[-1].call.seq

    @property
    def prompt_len(self) -> int:
        return self.pieces[0].start

    def sequence(self, upto: int | None = None) -> IdArray:
        """The segment's ids up to the end of piece `upto` (default: all of it)."""
        last = self.pieces[-1 if upto is None else upto]
        assert last.call.prompt is not None
        return np.concatenate([last.call.prompt, last.sampled.token_ids]).astype(IDS, copy=False)

    def arrays(self) -> SegmentArrays:
        ids = self.sequence()
        mask = np.zeros(len(ids), dtype=np.int8)
        logprobs = np.zeros(len(ids), dtype=LOGPROBS)
        complete = True
        answers: list[tuple[int, int]] = []
        for piece in self.pieces:
            sampled = piece.sampled
            start = piece.start
            end = start + len(sampled.token_ids)
            answers.append((start, end))
            mask[start:end] = 1
            if sampled.logprobs is None:
                logprobs[start:end] = np.nan
                complete = False
            else:
                logprobs[start:end] = sampled.logprobs
        lost = np.zeros(len(ids), dtype=bool)
        for lo, hi in self.lost:
            lost[lo:hi] = True
        lost_tokens = int(np.count_nonzero(lost & (mask == 1)))
        return SegmentArrays(
            ids, mask, logprobs, self.prompt_len, complete, lost_tokens, tuple(answers)
        )

    def locate(self, position: int, upto: int) -> Region:
        """Which part of the segment (up to piece `upto`) holds token `position`."""
        pieces = self.pieces[: upto + 1]
        starts = np.fromiter((p.start for p in pieces), dtype=np.int64, count=len(pieces))
        ends = np.fromiter((p.end for p in pieces), dtype=np.int64, count=len(pieces))
        i = int(np.searchsorted(ends, position, side="right"))
        if i >= len(pieces):
            last = pieces[-1]
            return Region("end", last.call.id, last.choice, last.end, last.end)
        piece = pieces[i]
        if position >= starts[i]:
            return Region("sampled", piece.call.id, piece.choice, piece.start, piece.end)
        lo = int(ends[i - 1]) if i else 0
        return Region("context", piece.call.id, piece.choice, lo, piece.start)


@dataclass(frozen=True)
class Region:
    kind: str
    """sampled (a call's completion), context (what came before it), or end (past the last)."""
    call_id: str
    choice: int
    start: int
    end: int


@dataclass(frozen=True)
class SegmentArrays:
    ids: IdArray
    mask: MaskArray
    logprobs: LogprobArray
    """The engine's logprob at every mask-1 position (NaN where it gave none), 0.0 elsewhere."""
    prompt_len: int
    has_logprobs: bool
    lost_tokens: int
    answers: tuple[tuple[int, int], ...] = ()
    """Each piece's sampled span [start, end) of `ids`, in order."""


@dataclass(frozen=True)
class Skipped:
    call_id: str
    seq: int
    reason: str


@dataclass
class Assembly:
    segments: list[Segment]
    skipped: list[Skipped]
    text_only: list[str]
    """Text-only calls: never token-faithful, so never part of a segment."""

    def piece_of(self, segment: int, call_id: str) -> int:
        return next(i for i, p in enumerate(self.segments[segment].pieces) if p.call.id == call_id)


def assemble(calls: Iterable[CallInput]) -> Assembly:
    ordered = sorted(calls, key=lambda c: c.seq)
    kept, skipped = _drop_retries_and_failures(ordered)
    builder = _Builder()
    for call in kept:
        builder.add(call)
    builder.settle_roles()
    return Assembly(builder.segments, skipped, builder.text_only)


class _Builder:
    def __init__(self) -> None:
        self.segments: list[Segment] = []
        self.text_only: list[str] = []

    def add(self, call: CallInput) -> None:
        if call.capture is Capture.TEXT:
            self._close_for_text(call)
            return
        side = _is_side(call)
        target = self._extendable(call, side)
        if target is None:
            segment = self._start(call, side)
        else:
            segment = self._promote(target)
            segment.pieces.append(Piece(call, call.choices[0].index))
        self._add_siblings(segment, call)

    def _extendable(self, call: CallInput, side: bool) -> Segment | None:
        """The open segment whose tail (last call plus its choice) the prompt extends; the
        longest such tail wins, then the most recently extended segment."""
        best: Segment | None = None
        best_len = -1
        for segment in sorted(self.segments, key=lambda s: -s.last_seq):
            if segment.closed_by is not None or (side and segment.role is not SegmentRole.SIDE):
                continue
            tail = segment.pieces[-1]
            if tail.end > best_len and _extends(call, tail.call, tail.choice):
                best, best_len = segment, tail.end
        return best

    def _promote(self, segment: Segment) -> Segment:
        """A later call went on from a sibling choice: that choice joins the main segment and
        the one the main segment held becomes the sibling."""
        link = segment.link
        if segment.role is not SegmentRole.SIBLING or len(segment.pieces) > 1 or link is None:
            return segment
        main = self.segments[link.parent_segment]
        tail, piece = main.pieces[-1], segment.pieces[0]
        if main.closed_by is not None or tail.call.id != piece.call.id:
            return segment
        tail.choice, piece.choice = piece.choice, tail.choice
        for s in self.segments:
            if (
                s.link is not None
                and s.link.kind is LinkKind.SIBLING
                and s.link.call_id == piece.call.id
            ):
                other = s.pieces[0].sampled.token_ids
                s.link.choice = tail.choice
                s.link.position = tail.start + common_prefix(tail.sampled.token_ids, other)
        return main

    def _start(self, call: CallInput, side: bool) -> Segment:
        assert call.prompt is not None
        index = len(self.segments)
        role = SegmentRole.SIDE if side else SegmentRole.MAIN
        segment = Segment(index, role, [Piece(call, call.choices[0].index)])
        parent = self._best_parent(call.prompt, side=side)
        if parent is not None:
            seg, piece_call, choice, position = parent
            if not _unrelated(call, seg, position, side):
                kind = LinkKind.SIDE if side else LinkKind.BREAK
                closed = seg.closed_by
                segment.link = Link(kind, seg.index, piece_call, choice, position, closed)
        self.segments.append(segment)
        return segment

    def _best_parent(
        self, prompt: IdArray, *, side: bool
    ) -> tuple[Segment, str, int | None, int] | None:
        """The earlier sequence sharing the longest prefix with `prompt`; ties go to the newest.
        A main-line call looks for its parent on the main line first, side segments after."""
        pools = [self.segments]
        if not side:
            main = [s for s in self.segments if s.role is not SegmentRole.SIDE]
            pools = [main, self.segments]
        for pool in pools:
            best = _longest_prefix(prompt, pool)
            if best is not None and best[3] > 0:
                return best
        return _longest_prefix(prompt, self.segments)

    def _add_siblings(self, segment: Segment, call: CallInput) -> None:
        if len(call.choices) < 2:
            return
        assert call.prompt is not None
        main = call.choices[0]
        for other in call.choices[1:]:
            position = len(call.prompt) + common_prefix(main.token_ids, other.token_ids)
            link = Link(LinkKind.SIBLING, segment.index, call.id, main.index, position)
            sibling = Segment(len(self.segments), SegmentRole.SIBLING, [Piece(call, other.index)])
            sibling.link = link
            self.segments.append(sibling)

    def _close_for_text(self, call: CallInput) -> None:
        self.text_only.append(call.id)
        side = _is_side(call)
        open_ = [s for s in self.segments if s.closed_by is None]
        if side:
            open_ = [s for s in open_ if s.role is SegmentRole.SIDE]
        else:
            open_ = [s for s in open_ if s.role is not SegmentRole.SIDE] or open_
        if not open_:
            return
        if call.prompt is not None:
            prompt = call.prompt

            def shared(s: Segment) -> tuple[int, int]:
                return common_prefix(prompt, s.sequence()), s.last_seq

            max(open_, key=shared).closed_by = call.id
        else:
            max(open_, key=lambda s: s.last_seq).closed_by = call.id

    def settle_roles(self) -> None:
        """Decide, now that the whole rollout is known, which new segments were side calls."""
        for segment in self.segments:
            link = segment.link
            if link is None or link.kind is not LinkKind.BREAK:
                continue
            parent = self.segments[link.parent_segment]
            carried_on = parent.last_seq > segment.first_seq
            continued = len(segment.pieces) > 1 or any(
                s.link is not None
                and s.link.parent_segment == segment.index
                and s.link.kind is LinkKind.BREAK
                for s in self.segments
            )
            overlap = link.position / max(1, segment.prompt_len)
            if carried_on or (not continued and overlap < SIDE_OVERLAP):
                link.kind = LinkKind.SIDE
                segment.role = SegmentRole.SIDE
        for segment in self.segments:
            link = segment.link
            if link is not None and link.kind is LinkKind.BREAK:
                parent = self.segments[link.parent_segment]
                end = parent.pieces[_piece_index(parent, link.call_id)].end
                if link.position < end:
                    parent.lost.append((link.position, end))


def _piece_index(segment: Segment, call_id: str) -> int:
    return next(i for i, p in enumerate(segment.pieces) if p.call.id == call_id)


def _is_side(call: CallInput) -> bool:
    return call.purpose is not None and call.purpose not in ("main", "")


def _longest_prefix(
    prompt: IdArray, segments: list[Segment]
) -> tuple[Segment, str, int | None, int] | None:
    best: tuple[Segment, str, int | None, int] | None = None
    for segment in sorted(segments, key=lambda s: -s.last_seq):
        for piece in reversed(segment.pieces):
            assert piece.call.prompt is not None
            shared = common_prefix(prompt, piece.call.prompt)
            choice: int | None = None
            if shared == len(piece.call.prompt):
                shared += common_prefix(prompt[shared:], piece.sampled.token_ids)
                choice = piece.choice
            if best is None or shared > best[3]:
                best = (segment, piece.call.id, choice, shared)
    return best


def _unrelated(call: CallInput, parent: Segment, position: int, side: bool) -> bool:
    """A main-line call sharing little with a side segment (the only kind there is so far)
    starts a line of its own."""
    if side or parent.role is not SegmentRole.SIDE:
        return False
    assert call.prompt is not None
    return position < SIDE_OVERLAP * len(call.prompt)


def _extends(call: CallInput, parent: CallInput, choice: int) -> bool:
    assert call.prompt is not None
    assert parent.prompt is not None
    sampled = parent.choice(choice).token_ids
    length = len(parent.prompt) + len(sampled)
    if call.stored_parent == (parent.id, choice, length):
        return True
    prompt = call.prompt
    if len(prompt) < length:
        return False
    return bool(
        np.array_equal(prompt[: len(parent.prompt)], parent.prompt)
        and np.array_equal(prompt[len(parent.prompt) : length], sampled)
    )


def _drop_retries_and_failures(calls: Sequence[CallInput]) -> tuple[list[CallInput], list[Skipped]]:
    """Keep one call per retried request (the one the harness went on with) and usable calls."""
    skipped: list[Skipped] = []
    by_id = {c.id: c for c in calls}
    repeats = {c.id: c.retry_of for c in calls if c.retry_of is not None} | _unlinked_retries(calls)

    def root(c: CallInput) -> str:
        seen = {c.id}
        while repeats.get(c.id) in by_id and repeats[c.id] not in seen:
            c = by_id[repeats[c.id]]
            seen.add(c.id)
        return c.id

    groups: dict[str, list[CallInput]] = {}
    for c in calls:
        reason = _unusable(c)
        if reason is not None:
            skipped.append(Skipped(c.id, c.seq, reason))
            continue
        groups.setdefault(root(c), []).append(c)
    kept: list[CallInput] = []
    for members in groups.values():
        chosen = members[0] if len(members) == 1 else _continued_member(members, calls)
        kept.append(chosen)
        skipped.extend(Skipped(m.id, m.seq, "retry") for m in members if m is not chosen)
    kept.sort(key=lambda c: c.seq)
    skipped.sort(key=lambda s: s.seq)
    return kept, skipped


def _unlinked_retries(calls: Sequence[CallInput]) -> dict[str, str]:
    """Retries recorded without `retry_of`, and the call each repeats: a client that timed out
    retries while its first request is still running, so nothing recorded had that body yet.
    The client counted it a retry, and another call carried the same body with fewer attempts."""
    found: dict[str, str] = {}
    for c in calls:
        if c.retry_of is not None or c.retry_count == 0 or c.body_hash is None:
            continue
        earlier = [o for o in calls if o.body_hash == c.body_hash and o.retry_count < c.retry_count]
        if earlier:
            found[c.id] = max(earlier, key=lambda o: (o.retry_count, o.seq)).id
    return found


def _unusable(c: CallInput) -> str | None:
    if c.status is not CallStatus.OK:
        return c.status.value
    if c.capture is Capture.NONE:
        return "not captured"
    if c.capture is Capture.TOKENS and (c.prompt is None or not c.choices):
        return "no tokens"
    return None


def _continued_member(members: list[CallInput], calls: Sequence[CallInput]) -> CallInput:
    """The member a later call extends (the answer the harness used), else the latest."""
    ids = {m.id for m in members}
    last_seq = max(m.seq for m in members)
    later = [c for c in calls if c.seq > last_seq and c.id not in ids and c.prompt is not None]
    for m in sorted(members, key=lambda m: -m.seq):
        if m.prompt is None:
            continue
        for c in later:
            if any(_extends(c, m, ch.index) for ch in m.choices):
                return m
    return max(members, key=lambda m: m.seq)
