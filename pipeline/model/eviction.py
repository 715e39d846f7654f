"""KV-cache eviction policies behind one interface: StreamingLLM, H2O, SnapKV and key norm. A full
cache keeps ``capacity - n_new`` entries per kv head, ranked by the row's policy, its ``recent``
newest entries and its sinks: kept, they rank above all; dropped, below all, so each eviction removes
sinks before anything else (one entry per decoded token once the cache is full); with ``policy``, the
policy's own scores rank them (docs/analysis.md, "sinklab kv-eval")."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

RECENT = 1e30  # above any score, below a kept sink


class Policy(ABC):
    """Scores per entry (higher is kept); ``recent(capacity)`` newest entries are always kept."""

    name = ""
    needs_attention = False

    def recent(self, capacity: int) -> int:
        return 0

    @abstractmethod
    def scores(self, history: History, row: int, keys: Tensor) -> Tensor:
        """[Hkv, n] for batch row ``row``; keys [Hkv, n, dh] (before rotation)."""


POLICIES: dict[str, type[Policy]] = {}


def register(*, name: str, needs_attention: bool = False) -> Callable[[type[Policy]], type[Policy]]:
    """The class decorator that registers a policy under ``name``; its fields (keyword-only) are its settings."""

    def add(cls: type[Policy]) -> type[Policy]:
        if name in POLICIES:
            raise ValueError(f"eviction policy {name!r} is registered twice")
        cls.name, cls.needs_attention = name, needs_attention
        POLICIES[name] = dataclass(frozen=True, kw_only=True)(cls)
        return POLICIES[name]

    return add


@register(name="streaming")
class StreamingLLM(Policy):
    """Xiao et al. 2024: the most recent entries (the first ones through the sink setting)."""

    def scores(self, history, row, keys):
        return history.pos[row].to(torch.float32)


@register(name="h2o", needs_attention=True)
class H2O(Policy):
    """Zhang et al. 2023: heavy hitters by attention received so far, plus the recent half."""

    def recent(self, capacity):
        return capacity // 2

    def scores(self, history, row, keys):
        return history.received[row]


@register(name="snapkv", needs_attention=True)
class SnapKV(Policy):
    """Li et al. 2024: attention from the last ``window`` queries, average-pooled over neighbouring keys."""

    window: int = 32
    """The observation window: the last queries whose attention ranks the entries."""
    kernel: int = 5
    """Width of the average pooling over neighbouring keys."""

    def recent(self, capacity):
        return min(self.window, capacity // 2)

    def scores(self, history, row, keys):
        votes = history.window[row].sum(dim=-2)  # [Hkv, n]
        return F.avg_pool1d(votes[:, None], self.kernel, stride=1, padding=self.kernel // 2)[:, 0]


@register(name="keynorm")
class KeyNorm(Policy):
    """Devoto et al. 2024: keep the keys of smallest L2 norm (the norm is rotation-free)."""

    def scores(self, history, row, keys):
        return -keys.float().norm(dim=-1)


SINKS = ("policy", "keep", "drop")  # a row's sinks: ranked by its policy, forced in, forced out


@dataclass(frozen=True)
class Row:
    policy: Policy
    first: int = 0  # leading stream positions that are sinks (learnable sink tokens included)
    sinks: str = "keep"  # keep: ranked above all; drop: below all, evicted first; policy: by the policy's scores

    def __post_init__(self):
        if self.sinks not in SINKS or self.first < 0:
            raise ValueError(
                f"cache row: sinks={self.sinks!r}, first={self.first}; want {'|'.join(SINKS)} and first >= 0"
            )


@dataclass
class History:
    """Per layer, what policies read about each cached entry (batch rows x kv heads)."""

    pos: Tensor  # [rows, Hkv, n] stream position
    received: Tensor  # [rows, Hkv, n] attention received, summed over queries (H2O)
    window: Tensor  # [rows, Hkv, w, n] the last w queries' attention (SnapKV)

    def keep(self, index: Tensor) -> None:
        self.pos, self.received = self.pos.gather(2, index), self.received.gather(2, index)
        self.window = self.window.gather(3, index[:, :, None].expand(-1, -1, self.window.shape[2], -1))


class Evictor:
    """The rows' policies over every layer; ``secondary[l]``: layer l's secondary-sink positions."""

    def __init__(
        self,
        rows: Sequence[Row],
        capacity: int,
        n_layers: int,
        kv_heads: int,
        secondary: Sequence[Tensor] | None = None,
        window: int = 32,
        device: torch.device | str = "cpu",
    ):
        if capacity < 1 or not rows:
            raise ValueError(f"cache capacity {capacity} with {len(rows)} rows: need capacity >= 1 and a row")
        self.rows, self.capacity, self.window = list(rows), capacity, window
        self.needs_attention = any(r.policy.needs_attention for r in rows)
        self.secondary = [torch.as_tensor(s, dtype=torch.long) for s in secondary] if secondary else None
        empty = torch.zeros(len(rows), kv_heads, 0, device=device)
        self.history = [History(empty.long(), empty, empty[:, :, None]) for _ in range(n_layers)]
        self.seen = 0
        self.first_held = torch.zeros(len(rows), dtype=torch.long, device=device)  # cases that kept position 0
        self.evictions = 0  # cases: (eviction, layer, kv head), the same for every row

    def indices(self, keys: Sequence[Tensor], n_new: int) -> list[Tensor] | None:
        """Per layer, the entries of keys [rows, Hkv, n, dh] to keep before n_new tokens ([rows, Hkv, m]) or None."""
        n = keys[0].shape[2]
        if n + n_new <= self.capacity:
            return None
        if n_new > self.capacity:
            raise ValueError(f"{n_new} new tokens exceed the cache capacity {self.capacity}")
        out = []
        for layer, (history, k) in enumerate(zip(self.history, keys)):
            prio = torch.stack([r.policy.scores(history, i, k[i]) for i, r in enumerate(self.rows)])
            recent = torch.tensor([r.policy.recent(self.capacity) for r in self.rows], device=k.device)
            prio = prio.masked_fill(torch.arange(n, device=k.device) >= n - recent[:, None, None], RECENT)
            keep, drop = (
                torch.tensor([r.sinks == mode for r in self.rows], device=k.device)[:, None, None]
                for mode in ("keep", "drop")
            )
            sinks = history.pos < torch.tensor([r.first for r in self.rows], device=k.device)[:, None, None]
            if self.secondary is not None:
                sinks |= torch.isin(history.pos, self.secondary[layer].to(k.device))
            prio = prio.masked_fill(sinks & keep, float("inf")).masked_fill(sinks & drop, float("-inf"))
            index = prio.topk(self.capacity - n_new, dim=-1).indices.sort(dim=-1).values
            history.keep(index)
            self.first_held += (history.pos == 0).any(-1).sum(-1).to(self.first_held.device)
            self.evictions += history.pos.shape[1]
            out.append(index)
        return out

    def first_kept(self) -> list[float | None]:
        """Per row, the share of (eviction, layer, kv head) whose kept entries hold stream position 0; None: none."""
        return [None if not self.evictions else float(h) / self.evictions for h in self.first_held.tolist()]

    def append(self, n_new: int) -> None:
        """n_new entries joined every layer (after the forward that cached them)."""
        for h in self.history:
            rows, heads = h.pos.shape[:2]
            new = torch.arange(self.seen, self.seen + n_new, device=h.pos.device).expand(rows, heads, -1)
            h.pos = torch.cat((h.pos, new), 2)
            h.received = F.pad(h.received, (0, n_new))
            h.window = F.pad(h.window, (0, n_new))
        self.seen += n_new

    def observe(self, weights: Sequence[Tensor]) -> None:
        """Per layer the step's attention [rows, H, n_q, n] over the n cached entries (after ``append``)."""
        for h, w in zip(self.history, weights):
            rows, heads, n_q, n = w.shape
            w = w.float().reshape(rows, h.pos.shape[1], -1, n_q, n).mean(2)  # query heads -> kv head
            h.received = h.received + w.sum(2)
            h.window = torch.cat((h.window, w), 2)[:, :, -self.window :]

    def sinks_held(self, limit: int) -> int:
        """The fewest entries at stream positions < limit over rows and heads (layer 0)."""
        return int((self.history[0].pos < limit).sum(-1).min()) if self.seen else 0
