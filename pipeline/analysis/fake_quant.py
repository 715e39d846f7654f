"""Simulated W8A8: fake quantization (quantize, then de-quantize in fp32) of every linear layer inside a model's
decoder blocks, SinkLab and Hugging Face models alike.

Weights: symmetric int8 per output channel, s_o = max_i |W_oi| / 127, Ŵ = clamp(round(W / s_o), −127, 127) · s_o.
Activations (a linear layer's input): symmetric int8 with a dynamic absmax step per sequence ("tensor") or per
position and head ("token"). The ``lead`` positions may be *intact* (full precision, weights included, and out of
the step: IntactKV, Liu et al. 2024) or *excluded* (out of the step but quantized with it, so they saturate).
Embeddings, the LM head, norms and the attention products stay at full precision."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.outliers import linear_input, linear_layers

QMAX = 127
_TINY = torch.finfo(torch.float32).tiny


@dataclass(frozen=True)
class QuantSetting:
    activations: str | None  # None: full precision; "tensor" or "token": the activation step
    lead: str = "none"  # the leading positions: "none" (as every other), "intact" or "exclude"
    description: str = ""


SETTINGS = {
    name: QuantSetting(*row)
    for name, *row in (
        ("fp", None, "none", "full precision (fp32)"),
        ("w8a8-tensor", "tensor", "none", "int8 weights per channel, activations per tensor"),
        ("w8a8-token", "token", "none", "int8 weights per channel, activations per token"),
        ("w8a8-tensor-intact", "tensor", "intact", "per tensor; leading positions at full precision (IntactKV)"),
        ("w8a8-token-intact", "token", "intact", "per token; leading positions at full precision (IntactKV)"),
        ("w8a8-tensor-exclude", "tensor", "exclude", "per tensor; step without the leading positions, which saturate"),
    )
}


def quantize_weight(weight: Tensor) -> Tensor:
    """Symmetric int8 per output channel (row), de-quantized."""
    step = weight.abs().amax(dim=1, keepdim=True).clamp_min(_TINY) / QMAX
    return (weight / step).round().clamp(-QMAX, QMAX) * step


def quantize_activation(x: Tensor, granularity: str, skip: int = 0) -> Tensor:
    """Symmetric int8 of a linear input ``x [B, (H,) T, d]``, de-quantized: one step per sequence from positions
    ``skip..`` ("tensor"), or one per row ("token")."""
    linear_input(x)
    if granularity == "tensor":
        amax = x[..., skip:, :].abs().amax(dim=tuple(range(1, x.dim())), keepdim=True)
    else:  # "token"
        amax = x.abs().amax(dim=-1, keepdim=True)
    step = amax.clamp_min(_TINY) / QMAX
    return (x / step).round().clamp(-QMAX, QMAX) * step


def _fake_quant_forward(module: nn.Linear, setting: QuantSetting, lead: int, weight_q: Tensor, x: Tensor) -> Tensor:
    skip = lead if setting.lead != "none" else 0
    if setting.lead == "intact" and skip:
        head = F.linear(x[..., :skip, :], module.weight, module.bias)
        tail = F.linear(quantize_activation(x[..., skip:, :], setting.activations), weight_q, module.bias)
        return torch.cat((head, tail), dim=-2)
    return F.linear(quantize_activation(x, setting.activations, skip), weight_q, module.bias)


@contextmanager
def fake_quantized(blocks: Sequence[nn.Module], setting: QuantSetting, lead: int = 1) -> Iterator[int]:
    """Every ``nn.Linear`` of ``blocks`` fake-quantized as ``setting`` says while inside; yields how many."""
    if setting.activations is None:
        yield 0
        return
    patched: dict[int, nn.Linear] = {}
    try:
        for _, _, module in linear_layers(blocks):
            if id(module) not in patched:
                weight_q = quantize_weight(module.weight.detach().float())
                module.forward = partial(_fake_quant_forward, module, setting, lead, weight_q)
                patched[id(module)] = module
        yield len(patched)
    finally:
        for module in patched.values():
            del module.forward  # the class's forward again
