"""Decoding through ``x + y`` KV caches, one config per batch row (`stream-ppl`, `passkey`, `length-eval`).

The cache keeps the first ``x`` entries (a SinkLab model's sink tokens among them) and the latest, ``x + y`` in all
with the incoming tokens; keys are held before the rotary rotation and re-rotated by their cache index."""

from __future__ import annotations

import abc
import inspect
import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pipeline.model.cache import eviction_index, gather_entries

PREFILL_TOKENS = 2048  # rows x tokens per forward while the cache fills: bounds the logits' memory


@dataclass(frozen=True)
class CacheSpec:
    n_initial: int
    n_recent: int

    @classmethod
    def parse(cls, text: str) -> CacheSpec:
        m = re.fullmatch(r"\s*(\d+)\s*\+\s*(\d+)\s*", text)
        if not m or int(m.group(2)) < 1:
            raise ValueError(f"cache config {text!r}: expected x+y with x >= 0 and y >= 1, e.g. 4+1020")
        return cls(int(m.group(1)), int(m.group(2)))

    def __str__(self) -> str:
        return f"{self.n_initial}+{self.n_recent}"


class Streamer(abc.ABC):
    """Decoding through one x + y cache per batch row (`stream-ppl`, `passkey`)."""

    sink_tokens = 0  # learnable sink tokens: the first cache entries, counted in x
    whole_kwargs: dict = {}  # what the model's forward takes beside the ids for one pass without a cache
    model: torch.nn.Module

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @abc.abstractmethod
    def stream(self, specs: Sequence[CacheSpec], evictor=None) -> Callable[[torch.Tensor], torch.Tensor]:
        """A fresh stream: ``feed(tokens [rows, n]) -> logits [rows, n, V]``, one row per config (all share x + y),
        evicting first what the n tokens need (n > 1 only while nothing is evicted); an ``evictor`` (one row per
        config) chooses the kept entries in place of x + y."""

    def read(
        self, feed, ids: torch.Tensor, specs: Sequence[CacheSpec], label: str = ""
    ) -> Iterator[tuple[int, torch.Tensor]]:
        """Feed ids [rows, T] through a stream of ``specs``; yield (t, logits of tokens t..t+n-1): in chunks until the
        cache is full (nothing is evicted), then one token at a time; a token counter on a terminal's stderr."""
        from tqdm.auto import tqdm

        rows, total = ids.shape
        fill = min(total, _batch_shape(specs)[1] - self.sink_tokens)
        chunk = max(1, PREFILL_TOKENS // rows)
        t = 0
        label = label or " ".join(map(str, specs))
        with tqdm(total=total, desc=label, unit="tok", leave=False, disable=not sys.stderr.isatty()) as bar:
            while t < total:
                n = min(chunk, fill - t) if t < fill else 1
                yield t, feed(ids[:, t : t + n])
                bar.update(n)
                t += n

    @torch.no_grad()
    def nll(self, ids: torch.Tensor, specs: Sequence[CacheSpec], label: str = "", evictor=None) -> torch.Tensor:
        """[len(specs), len(ids) - 1]: the NLL of ids[1:] under each cache config (all share x + y)."""
        rows, targets = len(specs), ids[1:]
        out_nll = torch.empty(rows, ids.numel() - 1)
        for t, logits in self.read(self.stream(specs, evictor), ids[:-1].expand(rows, -1), specs, label):
            n = logits.shape[1]
            picked = F.log_softmax(logits.float(), dim=-1).gather(-1, targets[t : t + n].expand(rows, n)[..., None])
            out_nll[:, t : t + n] = -picked[..., 0]
        return out_nll

    @torch.no_grad()
    def full_nll(self, ids: torch.Tensor) -> torch.Tensor:
        """The NLL of ids[1:] under full attention, one forward pass."""
        logits = self.model(ids[None], **self.whole_kwargs).logits[0, :-1]
        return F.cross_entropy(logits.float(), ids[1:], reduction="none")


class HFRotaryStreamer(Streamer):
    """Streaming for a HF decoder with one rotary module ``model.rotary_emb`` (llama family, Gemma-3): a
    ``DynamicCache`` rebuilt from the kept pre-rotary keys at every step."""

    whole_kwargs = {"use_cache": False}

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        base = getattr(model, "model", None)
        self.rotary = getattr(base, "rotary_emb", None)
        modeling = sys.modules[type(model).__module__]
        self.apply_rotary = getattr(modeling, "apply_rotary_pos_emb", None)
        if self.rotary is None or self.apply_rotary is None or hasattr(base, "rotary_emb_local"):
            raise ValueError(
                f"{type(model).__name__}: streaming needs one rotary module "
                "(llama-style model.rotary_emb); this model has none"
            )
        # rotary modules of models with several layer types take the layer's type (Gemma-3)
        per_type = "layer_type" in inspect.signature(self.rotary.forward).parameters
        self.layer_types = model.config.get_text_config().layer_types if per_type else None
        # transformers 5.x renamed forward's past_key_values to cache (the old name warns)
        self.cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def _rotate(self, k: torch.Tensor, positions: torch.Tensor, layer: int, inverse: bool = False) -> torch.Tensor:
        by_type = (self.layer_types[layer],) if self.layer_types else ()
        cos, sin = self.rotary(k, positions[None], *by_type)
        return self.apply_rotary(k, k, cos, -sin if inverse else sin)[1]

    def stream(self, specs: Sequence[CacheSpec], evictor=None) -> Callable[[torch.Tensor], torch.Tensor]:
        from transformers import DynamicCache

        n_initial, capacity = _batch_shape(specs)
        weights = evictor is not None and evictor.needs_attention
        if weights:
            self.model.set_attn_implementation("eager")  # attention weights for the policies
        keys: list[torch.Tensor] = []  # per layer, pre-rotary [rows, Hkv, n, dh] ([1, ...] while shared)
        values: list[torch.Tensor] = []
        shared = True  # every row has fed the same tokens and evicted nothing: one row computes them all

        @torch.no_grad()
        def feed(tokens: torch.Tensor) -> torch.Tensor:
            nonlocal keys, values, shared
            rows, n_new = tokens.shape
            if shared and ((keys and keys[0].shape[2] + n_new > capacity) or not bool((tokens == tokens[:1]).all())):
                shared = False
                keys = [k.expand(rows, -1, -1, -1) for k in keys]
                values = [v.expand(rows, -1, -1, -1) for v in values]
            run = tokens[:1] if shared else tokens
            if evictor is None:
                index = eviction_index(keys[0].shape[2] if keys else 0, n_new, n_initial, capacity)
                indices = None if index is None else [index] * len(keys)
            else:
                indices = evictor.indices(keys, n_new) if keys else None
            if indices is not None:
                keys = [gather_entries(k, index) for k, index in zip(keys, indices)]
                values = [gather_entries(v, index) for v, index in zip(values, indices)]
            n = keys[0].shape[2] if keys else 0
            pos = torch.arange(n, device=tokens.device)
            rotated = [(self._rotate(k, pos, i), v) for i, (k, v) in enumerate(zip(keys, values))] if n else None
            cache = DynamicCache(ddp_cache_data=rotated)
            new_pos = torch.arange(n, n + n_new, device=tokens.device)
            out = self.model(
                input_ids=run,
                position_ids=new_pos.expand(run.shape[0], -1),
                use_cache=True,
                output_attentions=weights,
                **{self.cache_arg: cache},
            )
            new = [
                (self._rotate(layer.keys[:, :, -n_new:], new_pos, i, inverse=True), layer.values[:, :, -n_new:])
                for i, layer in enumerate(cache.layers)
            ]
            keys = [torch.cat((k, nk), 2) for k, (nk, _) in zip(keys, new)] if keys else [nk for nk, _ in new]
            values = [torch.cat((v, nv), 2) for v, (_, nv) in zip(values, new)] if values else [nv for _, nv in new]
            if evictor is not None:
                evictor.append(n_new)
                if weights:
                    evictor.observe([w.expand(rows, -1, -1, -1) for w in out.attentions])
            return out.logits.expand(rows, -1, -1)

        return feed


class SinkLabStreamer(Streamer):
    """Streaming for a SinkLab ``Transformer`` through its ``StreamingCache``."""

    def __init__(self, model: torch.nn.Module, stream_positions: bool = False) -> None:
        self.model = model
        self.sink_tokens = model.config.sink_tokens
        self.stream_positions = stream_positions  # absolute embeddings at stream, not cache, positions

    def stream(self, specs: Sequence[CacheSpec], evictor=None) -> Callable[[torch.Tensor], torch.Tensor]:
        from pipeline.model import StreamingCache

        _batch_shape(specs)
        cache = StreamingCache(
            self.model.config,
            n_initial=[s.n_initial for s in specs],
            n_recent=[s.n_recent for s in specs],
            evictor=evictor,
            stream_positions=self.stream_positions,
        )
        weights = evictor is not None and evictor.needs_attention

        @torch.no_grad()
        def feed(tokens: torch.Tensor) -> torch.Tensor:
            out = self.model(tokens, cache=cache, output_attentions=weights)
            if weights:  # the slot columns (k*/v*, sink logit) are no cache entries
                evictor.observe([w[..., self.model.config.n_bias_slots :] for w in out.attentions])
            return out.logits

        return feed


def _batch_shape(specs: Sequence[CacheSpec]) -> tuple[list[int], int]:
    capacities = {s.n_initial + s.n_recent for s in specs}
    if len(capacities) != 1:
        raise ValueError(f"cache configs {[str(s) for s in specs]}: one batch needs one x+y; use group_by_capacity")
    return [s.n_initial for s in specs], capacities.pop()


def group_by_capacity(specs: Sequence[CacheSpec]) -> list[list[CacheSpec]]:
    """Configs that share x + y stream together as the rows of one batch (duplicates dropped)."""
    groups: dict[int, list[CacheSpec]] = {}
    for spec in dict.fromkeys(specs):
        groups.setdefault(spec.n_initial + spec.n_recent, []).append(spec)
    return list(groups.values())


def perplexity(nll: torch.Tensor) -> float:
    return math.exp(nll.double().mean().item())


def kv_heads(subject) -> tuple[int, int]:
    """(layers, kv heads): the shape of an evictor for ``subject``'s model."""
    if subject.kind == "sinklab":
        return subject.model.config.n_layers, subject.model.config.kv_heads
    text = subject.model.config.get_text_config()
    return text.num_hidden_layers, getattr(text, "num_key_value_heads", None) or text.num_attention_heads


def streamer_for(subject) -> Streamer:
    return SinkLabStreamer(subject.model) if subject.kind == "sinklab" else HFRotaryStreamer(subject.model)
