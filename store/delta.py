"""Prompts stored as (parent sequence, shared length, suffix), and rebuilt from that.

A "sequence" of an earlier call is its prompt alone, or its prompt followed by the ids one of its
choices sampled. A new prompt references whichever recent sequence shares the longest prefix with
it, so turn N of an agent costs only the tokens that turn N-1 did not already have.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from .packing import IDS, IdArray


@dataclass(frozen=True)
class PromptRef:
    parent_id: str | None
    parent_choice: int | None
    shared: int
    suffix: IdArray


@dataclass(frozen=True)
class KnownCall:
    """A call whose full token arrays are at hand, as a candidate parent."""

    call_id: str
    prompt: IdArray
    completions: Mapping[int, IdArray]


def common_prefix(a: IdArray, b: IdArray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = a[:n] != b[:n]
    first = int(differ.argmax())
    return first if differ[first] else n


def choose_parent(prompt: IdArray, candidates: Iterable[KnownCall]) -> PromptRef:
    """The candidate sequence sharing the longest prefix with `prompt`.

    Candidates come newest first and only a strictly longer match replaces the best so far, so
    ties go to the most recent call.
    """
    best = PromptRef(None, None, 0, prompt)
    for known in candidates:
        shared = common_prefix(prompt, known.prompt)
        if shared > best.shared:
            best = PromptRef(known.call_id, None, shared, prompt[shared:])
        if shared < len(known.prompt):
            continue
        rest = prompt[shared:]
        for index, completion in known.completions.items():
            total = shared + common_prefix(rest, completion)
            if total > best.shared:
                best = PromptRef(known.call_id, index, total, prompt[total:])
    return best


def parent_sequence(parent: KnownCall, choice: int | None) -> IdArray:
    if choice is None:
        return parent.prompt
    return np.concatenate([parent.prompt, parent.completions[choice]])


@dataclass(frozen=True)
class StoredPrompt:
    call_id: str
    parent_id: str | None
    parent_choice: int | None
    shared: int
    suffix: IdArray


def rebuild_prompts(
    stored: Iterable[StoredPrompt],
    completions: Mapping[tuple[str, int], IdArray],
    *,
    lenient: bool = False,
) -> dict[str, IdArray]:
    """Full prompts of calls given in an order where every parent comes before its children.

    `lenient`: a prompt whose parent sequence is missing is left out instead of raising
    KeyError (an auditor reading a damaged record)."""
    prompts: dict[str, IdArray] = {}
    for row in stored:
        if row.parent_id is None:
            prompts[row.call_id] = row.suffix
            continue
        no_choice = (
            row.parent_choice is not None and (row.parent_id, row.parent_choice) not in completions
        )
        if lenient and (row.parent_id not in prompts or no_choice):
            continue
        base = prompts[row.parent_id]
        # One copy per prompt: the parent's prompt, the part of its completion it shares (when
        # it reaches past that prompt) and the suffix, joined at once.
        if row.parent_choice is None or row.shared <= len(base):
            parts = [base[: row.shared], row.suffix]
        else:
            sampled = completions[(row.parent_id, row.parent_choice)]
            parts = [base, sampled[: row.shared - len(base)], row.suffix]
        prompts[row.call_id] = np.concatenate(parts, dtype=IDS)
    return prompts


class RecentCalls:
    """The last few calls of recently active rollouts, bounded in tokens held in memory."""

    def __init__(self, per_rollout: int = 4, max_tokens: int = 16_000_000) -> None:
        self._per_rollout = per_rollout
        self._max_tokens = max_tokens
        self._tokens = 0
        self._by_rollout: OrderedDict[str, deque[KnownCall]] = OrderedDict()

    @property
    def per_rollout(self) -> int:
        return self._per_rollout

    def __contains__(self, rollout_id: str) -> bool:
        return rollout_id in self._by_rollout

    def candidates(self, rollout_id: str) -> list[KnownCall]:
        calls = self._by_rollout.get(rollout_id)
        if calls is None:
            return []
        self._by_rollout.move_to_end(rollout_id)
        return list(reversed(calls))

    def load(self, rollout_id: str, calls: Iterable[KnownCall]) -> None:
        self._by_rollout.setdefault(rollout_id, deque())
        for known in calls:
            self.add(rollout_id, known)

    def add(self, rollout_id: str, known: KnownCall) -> None:
        calls = self._by_rollout.setdefault(rollout_id, deque())
        self._by_rollout.move_to_end(rollout_id)
        calls.append(known)
        self._tokens += _size(known)
        if len(calls) > self._per_rollout:
            self._tokens -= _size(calls.popleft())
        while self._tokens > self._max_tokens and len(self._by_rollout) > 1:
            _, evicted = self._by_rollout.popitem(last=False)
            self._tokens -= sum(_size(k) for k in evicted)

    def forget(self, rollout_id: str) -> None:
        evicted = self._by_rollout.pop(rollout_id, None)
        if evicted:
            self._tokens -= sum(_size(k) for k in evicted)


def _size(known: KnownCall) -> int:
    return len(known.prompt) + sum(len(c) for c in known.completions.values())
