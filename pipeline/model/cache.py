"""Streaming KV cache (StreamingLLM, Xiao et al. 2024 Table 10): keys held before the rotation,
``x + y`` eviction keeping the first x entries and the most recent ones (docs/model.md, "Streaming")."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .config import ModelConfig
from .eviction import Evictor


def eviction_index(length: int, n_new: int, n_initial: Sequence[int], capacity: int) -> Tensor | None:
    """Per row, the cached entries to keep (the first x, then the most recent) so that n_new more fit; None: all fit."""
    overflow = length + n_new - capacity
    if overflow <= 0:
        return None
    if n_new > capacity:
        raise ValueError(f"{n_new} new tokens exceed the cache capacity {capacity}")
    firsts = [min(x, length) for x in n_initial]
    return torch.stack([torch.cat((torch.arange(f), torch.arange(f + overflow, length))) for f in firsts])


def gather_entries(t: Tensor, index: Tensor) -> Tensor:
    """t [B, H, n, dh] -> [B, H, m, dh]: the entries of each row at index [B or 1, m] (or per head [B, H, m])."""
    idx = index.to(t.device)
    idx = (idx[:, None] if idx.dim() == 2 else idx)[..., None]
    return t.gather(2, idx.expand(t.shape[0], t.shape[1], -1, t.shape[3]))


class LayerCache:
    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        self.k = k if self.k is None else torch.cat((self.k, k), dim=2)
        self.v = v if self.v is None else torch.cat((self.v, v), dim=2)
        return self.k, self.v

    def keep(self, index: Tensor) -> None:
        if self.k is not None:
            self.k, self.v = gather_entries(self.k, index), gather_entries(self.v, index)


class StreamingCache:
    """x (``n_initial``) and y (``n_recent``) for every batch row, or one per row sharing x + y; an
    ``evictor``'s policies choose the kept entries instead."""

    def __init__(
        self,
        config: ModelConfig,
        n_initial: int | Sequence[int],
        n_recent: int | Sequence[int],
        evictor: Evictor | None = None,
        stream_positions: bool = False,
    ):
        xs = [n_initial] if isinstance(n_initial, int) else list(n_initial)
        ys = [n_recent] * len(xs) if isinstance(n_recent, int) else list(n_recent)
        if len(xs) != len(ys) or not xs:
            raise ValueError(f"cache x+y: {len(xs)} values of x for {len(ys)} of y; give one pair per batch row")
        for x, y in zip(xs, ys):
            if x < 0 or y < 1:
                raise ValueError(f"cache x+y = {x}+{y}: need x >= 0 and y >= 1")
        if len({x + y for x, y in zip(xs, ys)}) > 1:
            raise ValueError(f"cache x+y per row {[f'{x}+{y}' for x, y in zip(xs, ys)]}: rows must share x+y")
        self.n_initial, self.capacity = xs, xs[0] + ys[0]
        self.layers = [LayerCache() for _ in range(config.n_layers)]
        self.length = 0  # entries currently held (same in every layer and row)
        self.seen = 0  # entries ever appended (sink tokens included)
        self.sink_tokens = config.sink_tokens
        self.sinks_kept = 0  # sink-token entries still in the cache (the fewest over rows)
        self.evictor = evictor
        self.stream_positions = stream_positions
        if evictor is not None and (evictor.capacity != self.capacity or len(evictor.rows) != len(xs)):
            raise ValueError(
                f"evictor of {len(evictor.rows)} rows, capacity {evictor.capacity}: cache has {len(xs)}, {self.capacity}"
            )

    @property
    def position_shift(self) -> int:
        """Added to a cache index for an absolute position embedding: the stream position with ``stream_positions``."""
        return self.seen - self.length if self.stream_positions else 0

    def make_room(self, n_new: int) -> None:
        """Evict the middle so that length + n_new <= x + y (called before a forward)."""
        if self.evictor is not None:
            indices = self.evictor.indices([layer.k for layer in self.layers], n_new) if self.length else None
            for layer, index in zip(self.layers, indices or []):
                layer.keep(index)
            self.length = indices[0].shape[2] if indices else self.length
            self.sinks_kept = min(self.sinks_kept, self.evictor.sinks_held(self.sink_tokens))
            return
        index = eviction_index(self.length, n_new, self.n_initial, self.capacity)
        if index is None:
            return
        for layer in self.layers:
            layer.keep(index)
        self.sinks_kept = min(self.sinks_kept, *(min(x, self.length) for x in self.n_initial))
        self.length = index.shape[1]

    def advance(self, n_new: int, n_sinks: int) -> None:
        if self.evictor is not None:
            self.evictor.append(n_new)
        self.length += n_new
        self.seen += n_new
        self.sinks_kept += n_sinks
