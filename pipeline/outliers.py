"""Activation outliers: the largest |activation|, kurtosis, and a token-wise / channel-wise split (Gu et al. 2025,
appendix A.2), per sequence over its [T, d] tensor (Bondarenko et al. 2023); definitions in docs/analysis.md.

The *leading positions* are the learnable sink tokens, if any, and the first token.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, fields
from functools import partial

import numpy as np
import torch
from torch import Tensor, nn

from pipeline import metric_names as N

# thresholds in multiples of the median |x| of a sequence's tensor (docs/analysis.md says why)
CHANNEL_FACTOR = 20.0
CHANNEL_SHARE = 0.5
TOKEN_FACTOR = 100.0


def _as_sequences(x: Tensor) -> Tensor:
    if x.dim() == 2:
        x = x[None]
    if x.dim() != 3:
        raise ValueError(f"activations must be [B, T, d] or [T, d], got {tuple(x.shape)}")
    return x.detach().float()


def lower_median(rows: Tensor) -> Tensor:
    """``torch.median`` of each row of ``[B, n]`` (the lower middle value); on CPU by numpy's faster selection."""
    if rows.device.type != "cpu":
        return rows.median(dim=1).values
    k = (rows.shape[1] - 1) // 2
    return torch.from_numpy(np.partition(rows.numpy(), k, axis=1)[:, k].copy())


def max_abs(x: Tensor) -> Tensor:
    """‖x‖∞ of each sequence's tensor: ``[B, T, d] -> [B]``."""
    return _as_sequences(x).abs().amax(dim=(-2, -1))


def kurtosis(x: Tensor) -> Tensor:
    """Kurtosis of each sequence's T·d values, E[(x−μ)⁴] / E[(x−μ)²]² (Pearson's: 3 for a normal
    distribution, 1.8 for a uniform one; population moments): ``[B, T, d] -> [B]``."""
    return token_kurtosis(_as_sequences(x).flatten(1))


def token_kurtosis(x: Tensor) -> Tensor:
    """Kaul et al. (2025)'s κ_{m,t}: each token's kurtosis over its d channels as :func:`kurtosis`:
    ``[..., T, d] -> [..., T]``."""
    centred = x.detach().float() - x.detach().float().mean(dim=-1, keepdim=True)
    variance = centred.pow(2).mean(dim=-1)
    return centred.pow(4).mean(dim=-1) / variance.pow(2).clamp_min(torch.finfo(torch.float32).tiny)


@dataclass
class OutlierSplit:
    token_positions: Tensor  # [B, T] bool: the position holds a token-wise outlier
    channels: Tensor  # [B, d] bool: a channel-wise outlier channel


def outlier_split(x: Tensor) -> OutlierSplit:
    """Per sequence of ``x [B, T, d]``, with m the median |x| of that sequence's tensor: a channel with |x| >
    ``CHANNEL_FACTOR`` · m at ``CHANNEL_SHARE`` of the positions or more is *channel-wise*; an entry outside those
    channels with |x| > ``TOKEN_FACTOR`` · m is a *token-wise* outlier, its position a token-wise outlier position."""
    a = _as_sequences(x).abs()
    median = lower_median(a.flatten(1)).clamp_min(torch.finfo(torch.float32).tiny)[:, None, None]
    channels = (a > CHANNEL_FACTOR * median).float().mean(dim=1) >= CHANNEL_SHARE
    token_entries = (a > TOKEN_FACTOR * median) & ~channels[:, None, :]
    return OutlierSplit(token_positions=token_entries.any(dim=-1), channels=channels)


# per-layer fields of OutlierMeasures -> their act/ metric names
LAYER_METRICS = {
    "max_abs": "max_abs",
    "kurtosis_pooled": "kurtosis_pooled",
    "token_positions": "tokenwise_positions",
    "lead_pct": "tokenwise_lead_pct",
    "outlier_channels": "channelwise_channels",
}


@dataclass
class OutlierMeasures:
    """Per layer, means over sequences (see ``OutlierAccumulator``)."""

    lead: int  # leading positions: sink tokens + the first token
    max_abs: Tensor  # [L] ‖h‖∞ of the residual stream
    kurtosis_pooled: Tensor  # [L] Bondarenko et al.'s: over each sequence's whole [T, d] (not Kaul et al.'s)
    token_positions: Tensor  # [L] positions holding token-wise outliers, per sequence
    lead_pct: Tensor  # [L] % of sequences whose leading positions hold a token-wise outlier
    outlier_channels: Tensor  # [L] channel-wise outlier channels, per sequence
    channel_ids: list[list[int]]  # [L] channels that are channel-wise in at least half the sequences
    linear_max: dict[str, Tensor]  # linear name -> [L] ‖x‖∞ of its input (NaN where a layer has none)
    lead_scale_ratio: dict[str, Tensor]  # -> [L] ‖x‖∞ / ‖x without the leading positions‖∞

    def summary(self) -> dict[str, float | str]:
        """The largest of each over layers (and linears), with where it is (0-based layers)."""
        out: dict[str, float | str] = {}
        for key in ("max_abs", "kurtosis_pooled", "lead_pct"):
            values = getattr(self, key)
            layer = int(torch.nan_to_num(values, nan=-math.inf).argmax())
            out[key], out[f"{key}_at"] = float(values[layer]), f"l{layer}"
        for key, table in (("linear_max", self.linear_max), ("lead_scale_ratio", self.lead_scale_ratio)):
            cells = [(float(v), f"l{l}.{name}") for name, vs in table.items() for l, v in enumerate(vs) if v == v]
            if cells:
                out[key], out[f"{key}_at"] = max(cells)
        return out

    def to_metrics(self) -> dict[str, float]:
        """``act/...`` names, 0-based layers: per layer and, without a layer suffix, the largest."""
        out: dict[str, float] = {}
        for key, name in LAYER_METRICS.items():
            out.update({N.layer(N.act(name), l): float(v) for l, v in enumerate(getattr(self, key))})
        for name, values in self.linear_max.items():
            out.update({f"{N.layer(N.act('linear_max'), l)}_{name}": float(v) for l, v in enumerate(values) if v == v})
        if self.lead_scale_ratio:
            per_layer = torch.stack(list(self.lead_scale_ratio.values())).nan_to_num(nan=-math.inf).amax(dim=0)
            out.update(
                {N.layer(N.act("lead_scale_ratio"), l): float(v) for l, v in enumerate(per_layer) if v > -math.inf}
            )
        out.update({N.act(k): v for k, v in self.summary().items() if not k.endswith("_at")})
        return out

    def to_json(self) -> dict:
        plain = lambda v: v.tolist() if isinstance(v, Tensor) else v
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        tables = {k: {n: t.tolist() for n, t in v.items()} for k, v in values.items() if isinstance(v, dict)}
        return {k: plain(v) for k, v in values.items()} | tables | {"summary": self.summary()}


class OutlierAccumulator:
    """Per-sequence outlier statistics over batches; :meth:`measures` averages them."""

    def __init__(self, lead: int = 1) -> None:
        self.lead = lead
        self.rows: dict[str, list[Tensor]] = {k: [] for k in LAYER_METRICS}  # field -> [[B, L]]
        self.channel_hits: Tensor | None = None  # [L, d] sequences in which a channel was channel-wise
        self.linear: dict[tuple[int, str], list[Tensor]] = {}  # (layer, name) -> [[B, 2]] (all, rest) maxima

    def add_hidden(self, hidden_states: Sequence[Tensor]) -> None:
        """One batch of residual-stream states, per layer ``[B, T, d]`` (leading positions included)."""
        if not hidden_states:
            return
        splits = [outlier_split(h) for h in hidden_states]
        stats = {
            "max_abs": [max_abs(h) for h in hidden_states],
            "kurtosis_pooled": [kurtosis(h) for h in hidden_states],
            "token_positions": [s.token_positions.sum(dim=-1).float() for s in splits],
            "lead_pct": [s.token_positions[:, : self.lead].any(dim=-1).float() for s in splits],
            "outlier_channels": [s.channels.sum(dim=-1).float() for s in splits],
        }
        for key, per_layer in stats.items():
            self.rows[key].append(torch.stack(per_layer, dim=1).cpu())  # [B, L]
        hits = torch.stack([s.channels.sum(dim=0) for s in splits]).cpu()
        self.channel_hits = hits if self.channel_hits is None else self.channel_hits + hits

    def add_linear(self, layer: int, name: str, _module: nn.Module, args: tuple) -> None:
        """Forward pre-hook: ‖x‖∞ per sequence of a linear layer's input, with and without the leading positions."""
        if not args or not isinstance(args[0], Tensor):
            return
        a = linear_input(args[0]).detach().float().abs()
        per_sequence = tuple(range(1, a.dim()))
        rest = (
            a[..., self.lead :, :].amax(dim=per_sequence)
            if a.shape[-2] > self.lead
            else a.new_full(a.shape[:1], math.nan)
        )
        self.linear.setdefault((layer, name), []).append(torch.stack((a.amax(dim=per_sequence), rest), -1).cpu())

    def measures(self) -> OutlierMeasures | None:
        if not self.rows["max_abs"]:
            return None
        mean = {k: torch.cat(v).mean(dim=0) for k, v in self.rows.items()}  # [L] each
        mean["lead_pct"] = 100.0 * mean["lead_pct"]  # a share until here
        n_seq = sum(len(t) for t in self.rows["max_abs"])
        n_layers = mean["max_abs"].shape[0]
        linear: dict[str, Tensor] = {}  # name -> [L, 2]: mean ‖x‖∞, and mean ‖x‖∞ over it without the lead
        for (layer, name), chunks in self.linear.items():
            m = torch.cat(chunks)  # [N, 2]
            both = torch.stack((m[:, 0], m[:, 0] / m[:, 1].clamp_min(torch.finfo(torch.float32).tiny))).mean(dim=1)
            linear.setdefault(name, torch.full((n_layers, 2), math.nan))[layer] = both
        return OutlierMeasures(
            lead=self.lead,
            **mean,
            channel_ids=[torch.nonzero(row >= n_seq / 2).flatten().tolist() for row in self.channel_hits],
            linear_max={name: v[:, 0] for name, v in linear.items()},
            lead_scale_ratio={name: v[:, 1] for name, v in linear.items()},
        )


def linear_input(x: Tensor) -> Tensor:
    """A linear layer's input, checked: ``[B, T, d]``, or ``[B, H, T, d_h]`` for a per-head one (the MLP feature map)."""
    if x.dim() not in (3, 4):
        raise ValueError(f"linear inputs must be [B, T, d] or [B, H, T, d_h], got {tuple(x.shape)}")
    return x


def linear_layers(blocks: Sequence[nn.Module]) -> Iterator[tuple[int, str, nn.Linear]]:
    for layer, block in enumerate(blocks):
        for name, module in block.named_modules():
            if isinstance(module, nn.Linear):
                yield layer, name, module


@contextmanager
def capturing_linear_inputs(blocks: Sequence[nn.Module], acc: OutlierAccumulator | None) -> Iterator[None]:
    """While inside, every forward of a linear layer of ``blocks`` adds its input to ``acc`` (None: nothing)."""
    layers = linear_layers(blocks) if acc is not None else ()
    with ExitStack() as hooks:
        for l, name, module in layers:
            hooks.enter_context(module.register_forward_pre_hook(partial(acc.add_linear, l, name)))
        yield


@contextmanager
def capturing_block_outputs(blocks: Sequence[nn.Module]) -> Iterator[list[Tensor]]:
    """While inside, each block's output hidden states ``[B, T, d]`` are appended, detached, to the list it yields."""
    outputs: list[Tensor] = []

    def keep(_module, _inputs, out) -> None:
        outputs.append((out[0] if isinstance(out, tuple) else out).detach())

    with ExitStack() as hooks:
        for block in blocks:
            hooks.enter_context(block.register_forward_hook(keep))
        yield outputs


def summary_table(summaries: dict[str, dict]) -> list[str]:
    """Markdown rows of :meth:`OutlierMeasures.summary` records, one per label (an input kind, a model)."""
    columns = {  # summary key -> (header, format)
        "max_abs": ("residual ‖h‖∞ (layer)", ".1f"),
        "kurtosis_pooled": ("pooled kurtosis (layer)", ".1f"),
        "lead_pct": ("lead token-wise, % of sequences (layer)", ".0f"),
        "linear_max": ("linear input ‖x‖∞ (where)", ".1f"),
        "lead_scale_ratio": ("step inflation by the lead (where)", ".2f"),
    }
    cell = lambda s, key, fmt: "n/a" if key not in s else f"{s[key]:{fmt}} ({s[key + '_at']})"
    rows = [[label, *(cell(s, key, fmt) for key, (_, fmt) in columns.items())] for label, s in summaries.items()]
    line = lambda cells: f"| {' | '.join(cells)} |"
    return [line(["activations", *(h for h, _ in columns.values())]), "|---" * 6 + "|", *map(line, rows)]
