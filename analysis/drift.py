"""Why a rollout's token chain broke: each break between segments gets a drift class.

Evidence is weighed in this order:

1. Messages. The parent call's conversation (its request plus the answer it returned) is compared
   with the request that broke the chain. A message the harness dropped, inserted or changed is
   `history_edited`, except the answer itself left out of the next request with new messages in
   its place, which is `answer_dropped` (the harness rejected it; token-in mode names the same
   event so); an assistant turn that lost or gained its reasoning is `reasoning_stripped` /
   `reasoning_inserted`; tool-call arguments that differ as text but not as JSON are
   `tool_args_reserialized`. Used when the first changed message is at or before the place where
   the ids diverge (otherwise the ids broke first, for some other reason).
2. Text, when a `Detokenizer` is at hand: the diverging turn is decoded on both sides. Equal text
   is `retokenization`; text equal once `<think>` blocks are removed is reasoning stripped or
   inserted; equal once whitespace and special tokens are removed is `template_glue`; equal JSON
   values are `tool_args_reserialized`.
3. Tokens and the parent's answer alone (no tokenizer): a break in the last tokens of a completion
   is `template_glue`; a shorter re-rendering of an answer that had reasoning is
   `reasoning_stripped`; tokens inserted before an answer without reasoning are
   `reasoning_inserted`; an answer with tool calls is `tool_args_reserialized`; otherwise, when the
   harness replayed its messages verbatim, `retokenization`, else `other`.

A break right after a text-only call whose parent carried over intact is `text_only`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any, Protocol

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..store.errors import StoreError
from ..store.models import CallDialect, DriftClass, LinkKind
from ..store.packing import IdArray
from .segments import Assembly, Link, Region, Segment
from .turns import ConversationTurn, parsed_arguments, request_turns, response_turns

log = logging.getLogger(__name__)

_ANCHOR = 8
_GLUE_TOKENS = 2
_EXCERPT = 160
_SPECIAL = re.compile(r"<\|[^|>]{1,40}\|>|</?s>")
# A block, or reasoning that runs from the start to a `</think>` whose `<think>` was in the
# prompt (templates whose generation prompt opens it, served without a reasoning parser).
_THINK = re.compile(r"<think>.*?(</think>|$)|^(?:(?!<think>).)*?</think>", re.S)


class Detokenizer(Protocol):
    """Turns token ids back into text: an HF tokenizer, an engine's /detokenize, ...

    Raises `DetokenizeFailed` when it cannot; classification then goes on without text.
    """

    async def detokenize(self, sequences: Sequence[IdArray]) -> list[str]: ...


class DetokenizeFailed(StoreError):
    pass


@dataclass(frozen=True)
class Drift:
    kind: DriftClass
    position: int
    """Index of the first differing token, in the new prompt and in the parent's sequence."""
    parent_call: str
    parent_choice: int | None
    region: str
    """Where in the parent the ids diverged: sampled (a completion), context, or end."""
    region_call: str
    """The call whose completion (or the context before it) holds the divergence."""
    evidence: str
    """messages, text or tokens: what the class was decided on."""
    note: str
    message_index: int | None = None
    parent_text: str | None = None
    child_text: str | None = None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["kind"] = self.kind.value
        return data


@dataclass(frozen=True)
class BreakSite:
    """A segment whose first call broke the chain of the segment it branched from."""

    segment: int
    call_id: str
    prompt: IdArray
    parent: IdArray
    """The parent's sequence: its call's prompt and choice, as far as the link reaches."""
    link: Link
    region: Region
    parent_choice: int
    """The choice the parent segment follows at the parent call (also when the link's prefix
    ends inside that call's prompt): its answer is part of the conversation compared."""

    @cached_property
    def ends(self) -> tuple[int, int, int]:
        """(start, parent end, child end) of the diverging region in both sequences."""
        return self.region.start, self.region.end, _child_end(self)


class CallMessages:
    """A call's recorded bodies, parsed into turns on first use."""

    def __init__(self, dialect: CallDialect, request: bytes | None, response: bytes | None):
        self._dialect = dialect
        self._request = request
        self._response = response
        self._answers: dict[int, list[ConversationTurn] | None] = {}

    @cached_property
    def request(self) -> list[ConversationTurn] | None:
        return request_turns(self._dialect, self._request)

    def answer(self, choice: int) -> list[ConversationTurn] | None:
        if choice not in self._answers:
            self._answers[choice] = response_turns(self._dialect, self._response, choice)
        return self._answers[choice]


def break_sites(assembly: Assembly) -> list[BreakSite]:
    sites: list[BreakSite] = []
    for segment in assembly.segments:
        link = segment.link
        if link is None or link.kind is not LinkKind.BREAK:
            continue
        parent = assembly.segments[link.parent_segment]
        upto = assembly.piece_of(parent.index, link.call_id)
        prompt = segment.pieces[0].call.prompt
        assert prompt is not None
        sequence = parent.sequence(upto)
        region = _answer_boundary(parent.locate(link.position, upto), link.position, parent, upto)
        sites.append(
            BreakSite(
                segment.index,
                segment.pieces[0].call.id,
                prompt,
                sequence,
                link,
                region,
                parent.pieces[upto].choice,
            )
        )
    return sites


def _answer_boundary(region: Region, position: int, parent: Segment, upto: int) -> Region:
    """A change to an answer can show up a token or two early: BPE merges the end of the context
    before it with the answer's first characters (the newline closing a generation prompt and the
    newlines opening an answer re-encode as one token), so such a break belongs to the answer."""
    if region.kind != "context" or region.end - position > _GLUE_TOKENS:
        return region
    answer = parent.locate(region.end, upto)
    if answer.kind != "sampled":
        return region
    return Region("sampled", answer.call_id, answer.choice, position, answer.end)


def calls_to_read(site: BreakSite) -> set[str]:
    """Calls whose bodies the classification of `site` looks at."""
    return {site.call_id, site.link.call_id, site.region.call_id}


async def classify_all(
    sites: Sequence[BreakSite],
    messages: Mapping[str, CallMessages],
    detokenizer: Detokenizer | None = None,
) -> list[Drift]:
    texts: list[tuple[str, str] | None] = [None] * len(sites)
    wanted = [i for i, s in enumerate(sites) if s.region.kind != "end"]
    if detokenizer is not None and wanted:
        spans: list[IdArray] = []
        for i in wanted:
            start, parent_end, child_end = sites[i].ends
            spans += [sites[i].parent[start:parent_end], sites[i].prompt[start:child_end]]
        try:
            decoded = await detokenizer.detokenize(spans)
        except DetokenizeFailed:
            log.warning("detokenizing failed; classifying drift without text", exc_info=True)
        else:
            for n, i in enumerate(wanted):
                texts[i] = (decoded[2 * n], decoded[2 * n + 1])
    return [classify(s, messages, t) for s, t in zip(sites, texts, strict=True)]


def classify(
    site: BreakSite, messages: Mapping[str, CallMessages], texts: tuple[str, str] | None = None
) -> Drift:
    link, region = site.link, site.region

    def drift(kind: DriftClass, evidence: str, note: str, index: int | None = None) -> Drift:
        excerpts = (None, None) if texts is None else (_excerpt(texts[0]), _excerpt(texts[1]))
        return Drift(
            kind,
            link.position,
            link.call_id,
            link.choice,
            region.kind,
            region.call_id,
            evidence,
            note,
            index,
            *excerpts,
        )

    if region.kind == "end":
        if link.after_text_call is not None:
            return drift(
                DriftClass.TEXT_ONLY,
                "tokens",
                f"text-only call {link.after_text_call} came between; its answer has no ids",
            )
        return drift(
            DriftClass.OTHER,
            "tokens",
            "the prompt stops inside the parent's sequence (a re-sample or an unlinked retry)",
        )

    replayed: bool | None = None
    found = _message_difference(site, messages)
    if found is not None:
        index, kind, note, last = found
        if index is not None and index <= last:
            return drift(kind, "messages", note, index)
        replayed = True

    if texts is not None:
        kind, note = _by_text(texts[0], texts[1], region, replayed)
        return drift(kind, "text", note)
    kind, note = _by_tokens(site, messages, replayed)
    return drift(kind, "tokens", note)


def _message_difference(
    site: BreakSite, messages: Mapping[str, CallMessages]
) -> tuple[int | None, DriftClass, str, int] | None:
    """(first changed message or None, its class, a note, last message the region covers)."""
    child, parent, region_call = (
        messages.get(site.call_id),
        messages.get(site.link.call_id),
        messages.get(site.region.call_id),
    )
    if child is None or parent is None or region_call is None:
        return None
    if child.request is None or parent.request is None or region_call.request is None:
        return None
    answer = parent.answer(site.parent_choice)
    if answer is None:
        return None
    before = parent.request + answer
    # The context before a completion ends with the generation prompt of the answer to come,
    # so a change to the message at len(request) shows up in either region.
    last = len(region_call.request)
    if site.region.kind == "sampled":
        last += max(0, len(region_call.answer(site.region.choice) or []) - 1)
    difference = first_difference(before, child.request)
    if difference is None:
        return None, DriftClass.OTHER, "", last
    return (*difference, last)


def first_difference(
    before: list[ConversationTurn], after: list[ConversationTurn]
) -> tuple[int, DriftClass, str] | None:
    """Where `after` stops repeating `before`, and what kind of change it is (None: it does)."""
    for i, old in enumerate(before):
        if i >= len(after):
            return (
                i,
                DriftClass.HISTORY_EDITED,
                f"{len(before) - i} message(s) dropped from the end",
            )
        new = after[i]
        if old == new:
            continue
        if _answer_dropped(before[i:], after[i:]):
            return i, DriftClass.ANSWER_DROPPED, f"the answer at {i} was left out and asked again"
        if old.role == "assistant" and new.role == "assistant":
            return i, *_assistant_change(old, new)
        if old in after[i + 1 :]:
            return i, DriftClass.HISTORY_EDITED, f"a {new.role} message was inserted at {i}"
        if new in before[i + 1 :]:
            return i, DriftClass.HISTORY_EDITED, f"the {old.role} message at {i} was dropped"
        return i, DriftClass.HISTORY_EDITED, f"the {old.role} message at {i} was changed"
    return None


def _answer_dropped(rest: list[ConversationTurn], after: list[ConversationTurn]) -> bool:
    """`rest` is only the parent's answer (assistant turns at the end of the conversation), and
    the next request has none of it, going on with other messages in its place."""
    if not all(turn.role == "assistant" for turn in rest):
        return False
    return bool(after) and after[0].role != "assistant" and not any(t in after for t in rest)


def _assistant_change(old: ConversationTurn, new: ConversationTurn) -> tuple[DriftClass, str]:
    if old.reasoning and not new.reasoning:
        return DriftClass.REASONING_STRIPPED, "the harness sent the answer back without reasoning"
    if new.reasoning and not old.reasoning:
        return DriftClass.REASONING_INSERTED, "the harness added reasoning the model did not give"
    if old.text != new.text or old.reasoning != new.reasoning:
        return DriftClass.HISTORY_EDITED, "the harness changed an assistant answer"
    names = [c.name for c in old.tool_calls] == [c.name for c in new.tool_calls]
    same_values = names and all(
        parsed_arguments(a.arguments) == parsed_arguments(b.arguments)
        for a, b in zip(old.tool_calls, new.tool_calls, strict=True)
    )
    if same_values:
        return DriftClass.TOOL_ARGS, "the harness re-serialised tool-call arguments"
    return DriftClass.HISTORY_EDITED, "the harness changed the tool calls of an answer"


def _by_text(old: str, new: str, region: Region, replayed: bool | None) -> tuple[DriftClass, str]:
    if old == new:
        return DriftClass.RETOKENIZATION, "the same text came back as different ids"
    old_think, new_think = _has_think(old), _has_think(new)
    if old_think and not new_think and _glue_free(_THINK.sub("", old)) == _glue_free(new):
        return DriftClass.REASONING_STRIPPED, "the template left the sampled reasoning out"
    if new_think and not old_think and _glue_free(old) == _glue_free(_THINK.sub("", new)):
        return DriftClass.REASONING_INSERTED, "the template added reasoning markup"
    old_json, new_json = _json_spans(old), _json_spans(new)
    if (
        old_json[0]
        and old_json[0] == new_json[0]
        and old_json[1] != new_json[1]
        and _glue_free(old_json[2]) == _glue_free(new_json[2])
    ):
        return DriftClass.TOOL_ARGS, "the same JSON came back serialised differently"
    if _glue_free(old) == _glue_free(new):
        return DriftClass.TEMPLATE_GLUE, "only whitespace or special tokens differ"
    if region.kind == "context":
        if replayed:
            return DriftClass.TEMPLATE_GLUE, "the template rendered the same messages differently"
        return DriftClass.HISTORY_EDITED, "text between the model's turns changed"
    return DriftClass.OTHER, "the sampled text came back changed"


def _by_tokens(
    site: BreakSite, messages: Mapping[str, CallMessages], replayed: bool | None
) -> tuple[DriftClass, str]:
    region = site.region
    start, parent_end, child_end = site.ends
    position = site.link.position
    removed, added = parent_end - position, child_end - position
    if region.kind == "context":
        if replayed:
            return DriftClass.TEMPLATE_GLUE, "the template rendered the same messages differently"
        return DriftClass.OTHER, "the context between turns changed"
    if position >= parent_end - _GLUE_TOKENS and added <= _GLUE_TOKENS + 1:
        return DriftClass.TEMPLATE_GLUE, "only the last tokens of the answer differ"
    source = messages.get(region.call_id)
    answer = None if source is None else source.answer(region.choice)
    if answer:
        reasoning = any(t.reasoning for t in answer)
        calls = any(t.tool_calls for t in answer)
        if reasoning and added < removed:
            return DriftClass.REASONING_STRIPPED, "the answer came back shorter than its reasoning"
        if not reasoning and position == start and added > removed and _kept_after(site):
            return DriftClass.REASONING_INSERTED, "tokens were put in before the answer"
        if calls:
            return DriftClass.TOOL_ARGS, "an answer with tool calls came back re-rendered"
    if replayed:
        return DriftClass.RETOKENIZATION, "the harness replayed its messages, the ids differ"
    return DriftClass.OTHER, "the sampled ids came back changed"


def _kept_after(site: BreakSite) -> bool:
    """Whether the parent's diverging region comes back intact at the end of the child's: the
    tokens were put in before it rather than the same text re-encoded."""
    start, parent_end, child_end = site.ends
    size = parent_end - start
    return child_end - size >= start and np.array_equal(
        site.prompt[child_end - size : child_end], site.parent[start:parent_end]
    )


def _child_end(site: BreakSite) -> int:
    """Where the parent's diverging region ends in the child's prompt, found by matching what
    follows the region in the parent (or the region's last tokens, then its very last one: a
    template that drops a whole answer keeps only its end-of-turn token) after the divergence."""
    parent, child, p = site.parent, site.prompt, site.link.position
    start, end = site.region.start, site.region.end
    rest = child[p:]
    if end < len(parent):
        anchors = [parent[end : end + _ANCHOR]]
    else:
        anchors = [parent[max(p, end - n) : end] for n in (_GLUE_TOKENS, 1)]
    for anchor in anchors:
        if len(anchor) and len(rest) >= len(anchor):
            windows = sliding_window_view(rest, len(anchor))
            hits = np.flatnonzero((windows == anchor).all(axis=1))
            if hits.size:
                return p + int(hits[0]) + (len(anchor) if end == len(parent) else 0)
    return min(len(child), max(start, p + (end - p)))


def _has_think(text: str) -> bool:
    return "<think>" in text or "</think>" in text


def _glue_free(text: str) -> str:
    return "".join(_SPECIAL.sub("", text).split())


def _json_spans(text: str) -> tuple[list[Any], list[str], str]:
    """The JSON objects in a text (tool calls render as JSON in most templates): their values,
    their texts, and the text around them."""
    decoder = json.JSONDecoder()
    values: list[Any] = []
    raws: list[str] = []
    rest: list[str] = []
    done = 0
    i = text.find("{")
    while i != -1:
        try:
            value, end = decoder.raw_decode(text, i)
        except ValueError:
            i = text.find("{", i + 1)
            continue
        values.append(value)
        raws.append(text[i:end])
        rest.append(text[done:i])
        done = end
        i = text.find("{", end)
    rest.append(text[done:])
    return values, raws, "".join(rest)


def _excerpt(text: str) -> str:
    return text if len(text) <= _EXCERPT else text[: _EXCERPT // 2] + " … " + text[-_EXCERPT // 2 :]
