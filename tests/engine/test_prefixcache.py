"""The prefix cache's radix tree: longest-prefix lookups, copy-only-what-is-new inserts, LRU trims.

Keys and values here are stand-ins whose every entry is the token id at that position, so a
lookup's segments, laid end to end, must spell the ids they claim to hold.
"""

from __future__ import annotations

import torch

from rolltap.engine.prefixcache import PrefixCache, PrefixHit


def kv(ids: list[int]) -> torch.Tensor:
    """(layers=2, K/V, heads=1, tokens, dim=1) filled with the ids."""
    return torch.tensor(ids, dtype=torch.float32).view(1, 1, 1, -1, 1).repeat(2, 2, 1, 1, 1)


class Source:
    """The columns of one computed sequence, remembering which positions were asked for."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.asked: list[tuple[int, int]] = []

    def __call__(self, start: int, end: int) -> torch.Tensor:
        self.asked.append((start, end))
        return kv(self.ids[start:end])


def insert(cache: PrefixCache, ids: list[int], salt: str | None = None) -> Source:
    source = Source(ids)
    cache.insert(ids, source, salt)
    return source


def spelled(hit: PrefixHit) -> list[int]:
    if not hit.segments:
        return []
    whole = torch.cat(hit.segments, dim=3)
    assert torch.equal(whole, kv(whole[0, 0, 0, :, 0].int().tolist()))  # layers and K/V agree
    return [int(x) for x in whole[0, 0, 0, :, 0].tolist()]


def test_lookup_returns_the_longest_held_prefix_within_the_limit() -> None:
    cache = PrefixCache(100)
    insert(cache, [1, 2, 3, 4, 5])
    assert spelled(cache.lookup([1, 2, 3, 9, 9], 4, None)) == [1, 2, 3]
    assert cache.lookup([1, 2, 3, 4, 5, 6], 5, None).length == 5
    hit = cache.lookup([1, 2, 3, 4, 5], 4, None)  # the last prompt token is always computed
    assert (hit.length, spelled(hit)) == (4, [1, 2, 3, 4])
    assert cache.lookup([7, 1, 2], 2, None) == PrefixHit(0, [])


def test_an_insert_copies_only_the_positions_not_held() -> None:
    cache = PrefixCache(100)
    assert insert(cache, [1, 2, 3]).asked == [(0, 3)]
    assert insert(cache, [1, 2, 3, 4, 5]).asked == [(3, 5)]  # the next turn extends the last
    assert insert(cache, [1, 2]).asked == []  # held already
    assert insert(cache, [1, 2, 7]).asked == [(2, 3)]  # a branch: the node [3, 4, 5] is split
    assert cache.tokens == 6
    assert spelled(cache.lookup([1, 2, 3, 4, 5, 0], 6, None)) == [1, 2, 3, 4, 5]
    assert spelled(cache.lookup([1, 2, 7, 0], 4, None)) == [1, 2, 7]


def test_salted_requests_share_nothing_with_others() -> None:
    cache = PrefixCache(100)
    insert(cache, [1, 2, 3], salt="a")
    assert cache.lookup([1, 2, 3, 4], 3, None).length == 0
    assert cache.lookup([1, 2, 3, 4], 3, "b").length == 0
    assert cache.lookup([1, 2, 3, 4], 3, "a").length == 3
    assert insert(cache, [1, 2, 3]).asked == [(0, 3)]
    assert cache.tokens == 6


def test_the_least_recently_used_leaf_is_trimmed_first() -> None:
    cache = PrefixCache(8)
    insert(cache, [1, 2, 3, 4])
    insert(cache, [5, 6, 7, 8])
    cache.lookup([1, 2, 3, 4, 0], 4, None)  # [1..4] is now more recent than [5..8]
    insert(cache, [9, 10])
    assert (cache.tokens, cache.evicted_tokens) == (8, 2)
    assert spelled(cache.lookup([5, 6, 7, 8, 0], 4, None)) == [5, 6]  # its tail went
    assert cache.lookup([1, 2, 3, 4, 0], 4, None).length == 4
    assert cache.lookup([9, 10, 0], 2, None).length == 2

    # A shared prefix outlives the branches below it: only leaves are trimmed.
    insert(cache, [1, 2, 3, 4, 11, 12, 13])
    assert cache.tokens == 8
    assert cache.lookup([1, 2, 3, 4, 11, 12, 13, 0], 7, None).length == 7
    assert cache.lookup([5, 6, 0], 2, None).length == 0
    assert cache.lookup([9, 10, 0], 2, None).length == 1


def test_a_sequence_longer_than_the_cache_keeps_its_head() -> None:
    cache = PrefixCache(4)
    assert insert(cache, list(range(1, 11))).asked == [(0, 4)]
    assert spelled(cache.lookup(list(range(1, 11)), 9, None)) == [1, 2, 3, 4]
    cache.clear()
    assert (cache.tokens, cache.evicted_tokens) == (0, 4)
    assert cache.lookup([1, 2, 3], 2, None).length == 0
