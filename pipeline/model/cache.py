"""Streaming KV cache (StreamingLLM, seed 000 Table 10).

Keys are stored before the rotary rotation, so after an eviction the model re-rotates
every cached key by its index inside the cache. ``x + y`` eviction keeps the first
``n_initial`` entries (sink tokens, when the model has them, are the first entries) and
the most recent ones, so that the entries plus the incoming tokens never exceed x + y.

    cache = StreamingCache(model.config, n_initial=4, n_recent=1020)
    for t in range(T):
        logits = model(tokens[:, t:t+1], cache=cache).logits
"""
from __future__ import annotations

import torch
from torch import Tensor

from .config import ModelConfig


class LayerCache:
    def __init__(self) -> None:
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        if self.k is None:
            self.k, self.v = k, v
        else:
            self.k = torch.cat((self.k, k), dim=2)
            self.v = torch.cat((self.v, v), dim=2)
        return self.k, self.v

    def keep(self, n_initial: int, n_recent: int) -> None:
        if self.k is None:
            return
        self.k = torch.cat((self.k[:, :, :n_initial], self.k[:, :, self.k.shape[2] - n_recent:]), 2)
        self.v = torch.cat((self.v[:, :, :n_initial], self.v[:, :, self.v.shape[2] - n_recent:]), 2)


class StreamingCache:
    def __init__(self, config: ModelConfig, n_initial: int, n_recent: int):
        if n_initial < 0 or n_recent < 1:
            raise ValueError(f"cache x+y = {n_initial}+{n_recent}: need x >= 0 and y >= 1")
        self.n_initial, self.n_recent = n_initial, n_recent
        self.layers = [LayerCache() for _ in range(config.n_layers)]
        self.length = 0          # entries currently held (same in every layer)
        self.seen = 0            # entries ever appended (sink tokens included)
        self.sink_tokens = config.sink_tokens
        self.sinks_kept = 0      # sink-token entries still in the cache

    @property
    def capacity(self) -> int:
        return self.n_initial + self.n_recent

    def make_room(self, n_new: int) -> None:
        """Evict the middle so that length + n_new <= x + y (called before a forward)."""
        if n_new > self.capacity:
            raise ValueError(f"{n_new} new tokens exceed the cache capacity {self.n_initial}+{self.n_recent}")
        overflow = self.length + n_new - self.capacity
        if overflow <= 0:
            return
        keep_initial = min(self.n_initial, self.length)
        keep_recent = self.length - overflow - keep_initial
        for layer in self.layers:
            layer.keep(keep_initial, keep_recent)
        self.length = keep_initial + keep_recent
        self.sinks_kept = min(self.sinks_kept, keep_initial)

    def advance(self, n_new: int, n_sinks: int) -> None:
        self.length += n_new
        self.seen += n_new
        self.sinks_kept += n_sinks
