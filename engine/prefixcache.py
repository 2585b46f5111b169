"""Prefix caching: keys/values of computed sequences in a radix tree, reused by later prompts.

A path from a root spells token ids the engine has computed; each node holds its run of ids and
their keys and values for every layer in one tensor of shape (layers, 2, kv heads, tokens, head
dim). A lookup walks a prompt down the tree and returns the tensors to copy into the new row; an
insert copies in only the ids the tree lacks, so an agent's next turn (previous prompt + answer +
tool output) adds only its new tail, and rollouts sharing a system prompt share its node. The
token budget is kept by trimming least-recently-used leaves, so a prefix many sequences share
outlives the branches below it. Each `cache_salt` (vLLM's per-request field) has its own tree.
Only the scheduler thread calls these methods; other threads only read the counters.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

Columns = Callable[[int, int], torch.Tensor]
"""(start, end) -> keys and values of token positions [start, end): (layers, 2, heads, n, dim)."""


@dataclass(eq=False)
class _Node:
    ids: list[int]
    kv: torch.Tensor
    parent: _Node | None
    used: int
    children: dict[int, _Node] = field(default_factory=dict)


@dataclass(frozen=True)
class PrefixHit:
    length: int
    """How many leading prompt tokens the segments hold."""
    segments: list[torch.Tensor]
    """Keys and values of those tokens, in order; each (layers, 2, heads, n, dim)."""


class PrefixCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        """Most tokens held, over all salts."""
        self.tokens = 0
        self.evicted_tokens = 0
        self._roots: dict[str | None, _Node] = {}
        self._clock = itertools.count(1)

    def lookup(self, ids: Sequence[int], limit: int, salt: str | None) -> PrefixHit:
        """The longest prefix of `ids`, at most `limit` tokens long, that the tree holds."""
        node = self._roots.get(salt)
        segments: list[torch.Tensor] = []
        pos, now = 0, next(self._clock)
        while node is not None and pos < limit:
            child = node.children.get(ids[pos])
            if child is None:
                break
            n = _common(child.ids, ids, pos, limit)
            child.used = now
            segments.append(child.kv if n == len(child.ids) else child.kv[:, :, :, :n])
            pos += n
            node = child if n == len(child.ids) else None
        return PrefixHit(pos, segments)

    def insert(self, ids: Sequence[int], columns: Columns, salt: str | None) -> None:
        """Hold the keys/values of `ids`; `columns` is asked only for the positions not held yet."""
        ids = ids[: self.capacity]
        if not ids:
            return
        node = self._roots.setdefault(salt, _Node([], torch.empty(0), None, 0))
        pos, now = 0, next(self._clock)
        while pos < len(ids):
            child = node.children.get(ids[pos])
            if child is None:
                leaf = _Node(list(ids[pos:]), columns(pos, len(ids)), node, now)
                node.children[leaf.ids[0]] = leaf
                self.tokens += len(leaf.ids)
                break
            n = _common(child.ids, ids, pos, len(ids))
            child.used = now
            if pos + n == len(ids):
                break  # everything asked for is held already
            if n < len(child.ids):
                child = self._split(child, n)
            node, pos = child, pos + n
        self._evict()

    def clear(self) -> None:
        self.evicted_tokens += self.tokens
        self.tokens = 0
        self._roots.clear()

    def _split(self, node: _Node, n: int) -> _Node:
        """Cut `node` after its first n ids; returns the new upper half. Both halves are copied
        so that trimming one later frees its memory instead of keeping a shared buffer alive."""
        assert node.parent is not None
        head = _Node(node.ids[:n], node.kv[:, :, :, :n].clone(), node.parent, node.used)
        node.parent.children[head.ids[0]] = head
        node.ids, node.kv, node.parent = node.ids[n:], node.kv[:, :, :, n:].clone(), head
        head.children[node.ids[0]] = node
        return head

    def _evict(self) -> None:
        while self.tokens > self.capacity:
            leaf = min(self._leaves(), key=lambda node: node.used)
            excess = self.tokens - self.capacity
            if excess < len(leaf.ids):
                keep = len(leaf.ids) - excess
                leaf.ids, leaf.kv = leaf.ids[:keep], leaf.kv[:, :, :, :keep].clone()
                removed = excess
            else:
                assert leaf.parent is not None
                del leaf.parent.children[leaf.ids[0]]
                removed = len(leaf.ids)
            self.tokens -= removed
            self.evicted_tokens += removed
        for salt in [s for s, root in self._roots.items() if not root.children]:
            del self._roots[salt]

    def _leaves(self) -> Iterator[_Node]:
        stack = [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                yield node


def _common(held: list[int], ids: Sequence[int], start: int, stop: int) -> int:
    """How many of `held` equal ids[start:stop] from the start."""
    n = min(len(held), stop - start)
    for i in range(n):
        if held[i] != ids[start + i]:
            return i
    return n
