"""The running batch's KV cache: rows left-padded to end at one column, in preallocated buffers.

Every row ends at the same column, so one decode step writes all rows' new keys at one shared
column and transformers' ordinary 2-D attention mask hides each row's left padding. Buffers have
spare capacity so a decode step is a slice write, not a `torch.cat` of the whole cache (which
costs O(cache) per step). Rows join and leave by rebuilding the buffers once, which is O(cache)
per join or leave instead of per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

_HEADROOM = 64


class SlabLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """One layer's keys and values in a buffer with spare columns; `keys`/`values` are views."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._k = keys
        self._v = values
        self.length = length
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._publish()

    @classmethod
    def empty(
        cls, shape: tuple[int, int, int, int], dtype: torch.dtype, device: torch.device
    ) -> SlabLayer:
        return cls(
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
            0,
        )

    @property
    def capacity(self) -> int:
        return int(self._k.shape[-2])

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = key_states.shape[-2]
        if self.length + n > self.capacity:
            self._grow(self.length + n + max(_HEADROOM, self.length // 2))
        self._k[:, :, self.length : self.length + n] = key_states
        self._v[:, :, self.length : self.length + n] = value_states
        self.length += n
        self._publish()
        return self.keys, self.values  # type: ignore[return-value]

    def get_seq_length(self) -> int:
        return self.length

    def used(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The filled columns of keys and values (views)."""
        return self._k[:, :, : self.length], self._v[:, :, : self.length]

    def _grow(self, capacity: int) -> None:
        k = self._k.new_zeros((*self._k.shape[:2], capacity, self._k.shape[-1]))
        v = self._v.new_zeros(k.shape)
        k[:, :, : self.length] = self._k[:, :, : self.length]
        v[:, :, : self.length] = self._v[:, :, : self.length]
        self._k, self._v = k, v

    def _publish(self) -> None:
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]


def new_cache(
    num_layers: int,
    shape: tuple[int, int, int, int],
    dtype: torch.dtype,
    device: torch.device,
    prefix: Sequence[torch.Tensor] = (),
) -> Cache:
    """A cache for a forward pass; shape is (batch, kv heads, capacity, head dim).

    `prefix`: keys and values (layers, 2, heads, n, dim) of the first positions, in order (a
    prefix-cache hit), copied into every batch row.
    """
    layers = [SlabLayer.empty(shape, dtype, device) for _ in range(num_layers)]
    start = 0
    for segment in prefix:
        end = start + segment.shape[3]
        for layer, kv in zip(layers, segment, strict=True):
            layer._k[:, :, start:end] = kv[0]
            layer._v[:, :, start:end] = kv[1]
        start = end
    for layer in layers:
        layer.length = start
        layer._publish()
    return _cache(layers)


def columns(cache: Cache, row: int, start: int, end: int) -> torch.Tensor:
    """A copy of one row's keys and values in columns [start, end): (layers, 2, heads, n, dim)."""
    return torch.stack(
        [torch.stack((s._k[row, :, start:end], s._v[row, :, start:end])) for s in slabs(cache)]
    )


def _cache(layers: list[SlabLayer]) -> Cache:
    return Cache(layers=list[Any](layers))


def slabs(cache: Cache) -> list[SlabLayer]:
    layers = list(cache.layers)
    if not all(isinstance(layer, SlabLayer) for layer in layers):
        raise TypeError("the cache holds layers this engine did not create")
    return layers  # type: ignore[return-value]


@dataclass
class BatchCache:
    """The cache of all running rows, with each row's padding mask and next position."""

    cache: Cache
    mask: torch.Tensor
    """(rows, columns) long: 1 for a real token, 0 for left padding."""
    positions: torch.Tensor
    """(rows,) long: the position id of each row's next token."""

    @property
    def rows(self) -> int:
        return int(self.mask.shape[0])

    @property
    def columns(self) -> int:
        return int(self.mask.shape[1])

    def first_column(self, row: int) -> int:
        """The column of the row's first real token (rows end together, padding is on the left)."""
        return self.columns - int(self.mask[row].sum())

    def step_inputs(self, tokens: torch.Tensor) -> dict[str, object]:
        """Model kwargs for one decode step feeding `tokens` (rows,) at each row's next position."""
        ones = self.mask.new_ones((self.rows, 1))
        self.mask = torch.cat([self.mask, ones], dim=1)
        inputs = {
            "input_ids": tokens.view(-1, 1),
            "attention_mask": self.mask,
            "position_ids": self.positions.view(-1, 1),
            "past_key_values": self.cache,
            "use_cache": True,
        }
        self.positions = self.positions + 1
        return inputs


def join(batch: BatchCache | None, single: Cache, copies: int) -> BatchCache:
    """Append `copies` rows holding the one-row prefill cache `single` to the batch."""
    new_layers = slabs(single)
    new_len = new_layers[0].length
    old_len = batch.columns if batch else 0
    width = max(old_len, new_len)
    old_rows = batch.rows if batch else 0
    rows = old_rows + copies
    old_layers = slabs(batch.cache) if batch else [None] * len(new_layers)
    layers: list[SlabLayer] = []
    for old, new in zip(old_layers, new_layers, strict=True):
        heads, dim = new._k.shape[1], new._k.shape[3]
        grown = SlabLayer.empty((rows, heads, width + _HEADROOM, dim), new.dtype, new.device)
        if old is not None:
            old_k, old_v = old.used()
            grown._k[:old_rows, :, width - old_len : width] = old_k
            grown._v[:old_rows, :, width - old_len : width] = old_v
        new_k, new_v = new.used()
        grown._k[old_rows:, :, width - new_len : width] = new_k
        grown._v[old_rows:, :, width - new_len : width] = new_v
        grown.length = width
        grown._publish()
        layers.append(grown)
    device = new_layers[0].device
    mask = torch.zeros((rows, width), dtype=torch.long, device=device)
    if batch is not None:
        mask[:old_rows, width - old_len :] = batch.mask
    mask[old_rows:, width - new_len :] = 1
    positions = torch.full((copies,), new_len, dtype=torch.long, device=device)
    if batch is not None:
        positions = torch.cat([batch.positions, positions])
    return BatchCache(_cache(layers), mask, positions)


def keep(batch: BatchCache, rows: list[int]) -> BatchCache | None:
    """The batch reduced to `rows` (in that order), dropping padding no remaining row needs."""
    if not rows:
        return None
    index = torch.tensor(rows, dtype=torch.long, device=batch.mask.device)
    mask = batch.mask.index_select(0, index)
    # Columns before the longest remaining row's first real token are padding in every row.
    first = int(torch.argmax((mask.sum(dim=0) > 0).to(torch.int8)))
    mask = mask[:, first:].contiguous()
    width = mask.shape[1]
    layers: list[SlabLayer] = []
    for old in slabs(batch.cache):
        old_k, old_v = old.used()
        k = old_k.index_select(0, index)[:, :, first:]
        v = old_v.index_select(0, index)[:, :, first:]
        layer = SlabLayer.empty(
            (len(rows), k.shape[1], width + _HEADROOM, k.shape[3]), k.dtype, k.device
        )
        layer._k[:, :, :width] = k
        layer._v[:, :, :width] = v
        layer.length = width
        layer._publish()
        layers.append(layer)
    return BatchCache(_cache(layers), mask, batch.positions.index_select(0, index))
