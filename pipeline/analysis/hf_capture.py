"""Attention maps, block outputs and post-rotary queries/keys/values of a Hugging Face causal LM, as a
:class:`SinkMeasures`: ``sinklab_eager`` (registered here) runs the model's own eager attention and captures
its inputs; hooks on the blocks read the hidden states before the final norm."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch import Tensor

from pipeline.flow import FlowAccumulator, capturing_inputs
from pipeline.outliers import OutlierAccumulator, capturing_block_outputs, capturing_linear_inputs
from pipeline.probe import SinkAccumulator, as_token_tensor
from pipeline.sink_measures import SinkMeasures

IMPLEMENTATION = "sinklab_eager"
_qkv_calls: list | None = None  # (query, key, value, head output) per attention call while capturing


def _capturing_eager(module, query, key, value, attention_mask, **kwargs):
    eager = sys.modules[type(module).__module__].eager_attention_forward
    out, weights = eager(module, query, key, value, attention_mask, **kwargs)
    if _qkv_calls is not None:
        n_rep = query.shape[1] // key.shape[1]
        kv = (t.detach().repeat_interleave(n_rep, 1) for t in (key, value))  # kv heads repeated to H
        _qkv_calls.append((query.detach(), *kv, out.detach().transpose(1, 2)))
    return out, weights


def ensure_registered() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, _capturing_eager)
    AttentionMaskInterface.register(IMPLEMENTATION, ALL_MASK_ATTENTION_FUNCTIONS["eager"])


def decoder_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The list of transformer blocks (``model.layers`` for llama/gemma, ``transformer.h`` for GPT-2)."""
    n_layers = model.config.get_text_config().num_hidden_layers
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n_layers:
            return module
    raise ValueError(f"cannot find the {n_layers} decoder blocks of {type(model).__name__}")


@dataclass
class Captured:
    attentions: list[Tensor]  # [B, H, T, T] per layer
    hidden_states: list[Tensor]  # [B, T, d] per block output, the last before the final norm
    queries: list[Tensor] | None = None  # [B, H, T, dh] post-rotary
    keys: list[Tensor] | None = None  # [B, H, T, dh], kv heads repeated to H
    values: list[Tensor] | None = None
    head_outputs: list[Tensor] | None = None  # [B, H, T, dh] A·V per head, before o_proj


def capture(model: torch.nn.Module, ids: Tensor, qkv: bool = True) -> Captured:
    """One no-grad forward pass of ``ids [B, T]`` collecting everything the metrics need."""
    global _qkv_calls
    if qkv and model.config._attn_implementation != IMPLEMENTATION:
        ensure_registered()
        model.set_attn_implementation(IMPLEMENTATION)
    calls = _qkv_calls = []
    try:
        with torch.no_grad(), capturing_block_outputs(decoder_blocks(model)) as hidden:
            out = model(input_ids=ids, output_attentions=True, use_cache=False, logits_to_keep=1)
    finally:
        _qkv_calls = None
    captured = Captured(attentions=[a.float() for a in out.attentions], hidden_states=hidden)
    if qkv and calls:
        captured.queries, captured.keys, captured.values, captured.head_outputs = map(list, zip(*calls))
    return captured


def hf_sink_measures(
    model: torch.nn.Module, tokens, eps: float = 0.3, positions: int = 10, batch_size: int = 25
) -> SinkMeasures:
    """Sink metrics, activation outliers and the information flow of a HF model on ``tokens [N, T]``."""
    tokens = as_token_tensor(tokens, next(model.parameters()).device)
    acc = SinkAccumulator(eps, positions, OutlierAccumulator(lead=1), FlowAccumulator())
    model.eval()
    for start in range(0, tokens.shape[0], batch_size):
        ids = tokens[start : start + batch_size]
        with (
            capturing_linear_inputs(decoder_blocks(model), acc.outliers),
            capturing_inputs(model, acc.flow) as embedded,
        ):
            c = capture(model, ids)
        acc.add(**vars(c))  # each field of Captured is an argument of add
        perturbed = lambda: capture(model, ids, qkv=False).hidden_states  # noqa: B023, E731
        acc.flow.add_pass(model, c.hidden_states, perturbed, embedded, ids.shape[1])  # the same eager path again
    return acc.measures()
