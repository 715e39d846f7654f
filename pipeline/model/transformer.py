"""The decoder: embeddings (+ optional learnable sink tokens), L blocks, final norm, head."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .attention import Attention, length_scale_init
from .attention_ops import op_spec
from .cache import StreamingCache
from .config import ModelConfig
from .ffn import FFN
from .masks import AttentionContext
from .positional import POSITIONAL


@dataclass
class ModelOutput:
    logits: Tensor | None  # [B, T, V], real tokens only (None: skip_head)
    attentions: list[Tensor] | None = None  # per layer [B, H, Tq, Tk]
    attention_kind: str = "probs"  # "probs" | "sim_nonneg" | "sim_signed"
    n_extra_queries: int = 0  # leading rows that are sink tokens
    n_extra_keys: int = 0  # leading columns that are not real tokens
    # per block [B, Tq, d]: its output (the last before the final norm); post-norm: its sum before the last LN
    hidden_states: list[Tensor] | None = None
    queries: list[Tensor] | None = None  # per layer [B, H, T, dh], real tokens, rotated
    keys: list[Tensor] | None = None
    values: list[Tensor] | None = None
    head_outputs: list[Tensor] | None = None  # per layer [B, H, T, dh], real tokens (with attentions)
    final_hidden: Tensor | None = None  # [B, T, d] what the LM head reads (skip_head only)


def build_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "layernorm":
        return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
    return nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)


class Block(nn.Module):
    """Pre-norm (Eq. 2): h + MHSA(LN(h)), then + FFN(LN(.)). Post-norm (Eq. 3): LN(h + MHSA(h)), then
    LN(. + FFN(.)). Returns the output, the attention capture and the state hidden_states records."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.pre_norm = cfg.norm_position == "pre"
        self.attn_norm = build_norm(cfg)
        self.attn = Attention(cfg)
        self.ffn_norm = build_norm(cfg)
        self.ffn = FFN(cfg)

    def forward(self, x: Tensor, ctx: AttentionContext, layer_cache=None, need_weights=False, need_qkv=False):
        if self.pre_norm:
            a, capture = self.attn(self.attn_norm(x), ctx, layer_cache, need_weights, need_qkv)
            x = x + a
            x = x + self.ffn(self.ffn_norm(x))
            return x, capture, x
        a, capture = self.attn(x, ctx, layer_cache, need_weights, need_qkv)
        x = self.attn_norm(x + a)
        residual = x + self.ffn(x)
        return self.ffn_norm(residual), capture, residual


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config  # checked when it was built (ModelConfig.__post_init__)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.sink_tokens = nn.Parameter(torch.zeros(config.sink_tokens, config.d_model)) if config.sink_tokens else None
        self.positional = POSITIONAL[config.positional](config)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        # post-norm blocks already end in a norm
        self.norm = build_norm(config) if config.norm_position == "pre" else nn.Identity()
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.reset_parameters()
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def reset_parameters(self) -> None:
        std = self.config.init_std
        residual_std = std / math.sqrt(2 * self.config.n_layers)
        for name, p in self.named_parameters():
            if name.endswith(("attn.out.weight", "ffn.down.weight")):
                nn.init.normal_(p, 0.0, residual_std)
            elif name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith(("sink_logit", "slot_logit", "norm.bias")):
                nn.init.zeros_(p)
            elif name.endswith("length_scale"):
                nn.init.constant_(p, length_scale_init(self.config))
            else:
                nn.init.normal_(p, 0.0, std)

    def num_parameters(self, embeddings: bool = True) -> int:
        n = sum(p.numel() for p in self.parameters())
        if not embeddings:
            n -= self.embed.weight.numel()
            if not self.config.tie_embeddings:
                n -= self.lm_head.weight.numel()
        return n

    def forward(
        self,
        idx: Tensor,
        *,
        positions: Tensor | None = None,
        cache: StreamingCache | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        output_qkv: bool = False,
        skip_head: bool = False,
    ) -> ModelOutput:
        cfg = self.config
        B = idx.shape[0]
        x = self.embed(idx)
        add_sinks = self.sink_tokens is not None and (cache is None or cache.seen == 0)
        n_sinks = cfg.sink_tokens if add_sinks else 0
        if add_sinks:
            x = torch.cat((self.sink_tokens[None].expand(B, -1, -1).to(x.dtype), x), dim=1)
        T = x.shape[1]

        offset = 0
        if cache is not None:
            if positions is not None:
                raise ValueError("positions= and cache= are exclusive: the cache sets positions itself")
            cache.make_room(T)
            offset = cache.length
        q_idx = torch.arange(offset, offset + T, device=idx.device)
        k_idx = torch.arange(0, offset + T, device=idx.device)
        q_pos = positions.to(idx.device) if positions is not None else q_idx
        k_pos = q_pos if positions is not None else k_idx
        if positions is not None and positions.shape != (T,):
            raise ValueError(f"positions must have shape ({T},) (sink tokens included), got {tuple(positions.shape)}")

        absolute = self.positional.input_embedding(q_pos + (cache.position_shift if cache is not None else 0))
        if absolute is not None:
            x = x + absolute.to(x.dtype)[None]
        rotary_k = self.positional.rotary(k_pos)
        score_bias = self.positional.score_bias(q_pos, k_pos)
        ctx = AttentionContext(
            q_pos=q_pos,
            k_pos=k_pos,
            rotary_q=None if rotary_k is None else tuple(t[-T:] for t in rotary_k),
            rotary_k=rotary_k,
            config=cfg,
            q_idx=q_idx,
            k_idx=k_idx,
            score_bias=score_bias,
            plain_causal=cfg.mask == "causal" and offset == 0 and score_bias is None,
        )

        hidden, captures = [], []  # captures: None unless attentions or q, k, v are asked for
        for i, block in enumerate(self.blocks):
            layer_cache = cache.layers[i] if cache is not None else None
            x, capture, state = block(x, ctx, layer_cache, output_attentions, output_qkv)
            if output_hidden_states:
                hidden.append(state)
            captures.append(capture)
        if cache is not None:
            cache.advance(T, n_sinks)

        final = self.norm(x[:, n_sinks:])
        out = ModelOutput(
            logits=None if skip_head else self.lm_head(final),
            final_hidden=final if skip_head else None,
            n_extra_queries=n_sinks,
            n_extra_keys=cfg.n_bias_slots + (cache.sinks_kept if cache is not None else n_sinks),
            hidden_states=hidden if output_hidden_states else None,
            attention_kind=op_spec(cfg.attention.op).kind(cfg.attention),
        )
        if output_attentions:
            out.attentions = [r.weights for r in captures]
            out.head_outputs = [r.head_out[:, :, n_sinks:] for r in captures]
        if output_qkv:
            out.queries = [r.q[:, :, n_sinks:] for r in captures]
            out.keys = [r.k[:, :, n_sinks:] for r in captures]
            out.values = [r.v[:, :, n_sinks:] for r in captures]
        return out
