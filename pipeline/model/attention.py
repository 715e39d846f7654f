"""Multi-head self-attention with the paper's biases (Tables 4, 5, 12, 13) and operations. The slots,
key columns that are not tokens, come first: the k*/v* slot, then the sink-logit column (a zero key and value
whose logit is learned per query head, or 0); ``Attention._path`` picks SDPA, blocked kernels or eager. Under
grouped-query attention keys, values, the cache and the k*/v* slot are per key/value head (docs/model.md)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.kernels import blocked_attention

from .attention_ops import blocked_spec, build_feature_map, op_spec
from .config import ModelConfig
from .masks import AttentionContext
from .positional import apply_rotary

try:  # optional, CUDA only
    from flash_attn import flash_attn_func
except ImportError:  # pragma: no cover - depends on the machine
    flash_attn_func = None


def expand_heads(t: Tensor, n_heads: int) -> Tensor:
    """t [B, h, n, d] -> [B, n_heads, n, d]: each of h heads repeated for its n_heads / h query heads."""
    h = t.shape[1]
    if h == n_heads:
        return t
    if h == 1:
        return t.expand(t.shape[0], n_heads, *t.shape[2:])
    return t.repeat_interleave(n_heads // h, dim=1)


class AttentionCapture(NamedTuple):
    weights: Tensor | None  # [B, H, Tq, Tk] incl. slot columns
    q: Tensor | None  # [B, H, Tq, dh] after rotation
    k: Tensor | None  # [B, H, Tq, dh] keys of this step's inputs, after rotation
    v: Tensor | None
    head_out: Tensor | None = None  # [B, H, Tq, dh] each head's output as it enters W_O (with weights)


class KeyValueSlot(nn.Module):
    """k* (learnable; only the first d_a dims when key_dims > 0) and v* (learnable for
    ``kv``; fixed m v' or m v'' for ``k``), one per key/value head or shared by the heads."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        b, dh = cfg.biases, cfg.head_dim
        heads = 1 if b.shared_heads else cfg.kv_heads
        self.head_dim = dh
        self.key = nn.Parameter(torch.zeros(heads, b.key_dims or dh))
        if b.kind == "kv":
            self.value = nn.Parameter(torch.zeros(heads, dh))
        else:
            direction = torch.eye(dh)[0] if b.value_direction == "onehot" else torch.full((dh,), 1.0 / math.sqrt(dh))
            self.register_buffer("value", (b.value_norm * direction).expand(heads, dh).clone())

    def keys_values(self, batch: int, n_heads: int) -> tuple[Tensor, Tensor]:
        key = F.pad(self.key, (0, self.head_dim - self.key.shape[-1]))
        expand = (batch, -1, 1, self.head_dim)
        key, value = key[None, :, None, :].expand(expand), self.value[None, :, None, :].expand(expand)
        return expand_heads(key, n_heads), expand_heads(value, n_heads)


def length_scale_init(cfg: ModelConfig) -> float:
    """SSMax's initial s_h: 1 / log(max_seq_len), so that s_h log n = 1 at n = max_seq_len."""
    return 1.0 / math.log(max(cfg.max_seq_len, 2))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d, H, dh = cfg.d_model, cfg.n_heads, cfg.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = H, cfg.kv_heads, dh
        kv = cfg.kv_heads * dh
        self.qkv = nn.Linear(d, d + 2 * kv, bias=False)
        self.qkv.fused_rows = (d, kv, kv)  # W_Q, W_K, W_V stacked: optimisers may treat each apart
        self.out = nn.Linear(d if cfg.head_merge == "concat" else dh, d, bias=False)
        a, b = cfg.attention, cfg.biases
        self.q_norm = nn.RMSNorm(dh, eps=cfg.norm_eps) if a.qk_norm else None
        self.k_norm = nn.RMSNorm(dh, eps=cfg.norm_eps) if a.qk_norm else None
        # one gate score per head (headwise) or per head-dimension element (elementwise, G1)
        self.gate = nn.Linear(d, H if a.gate_granularity == "headwise" else d, bias=False) if a.gated else None
        self.kv_slot = KeyValueSlot(cfg) if b.kind in ("kv", "k") else None
        self.value_bias = nn.Parameter(torch.zeros(1 if b.shared_heads else H, dh)) if b.kind == "v" else None
        self.sink_logit = nn.Parameter(torch.zeros(H)) if a.sink_logit else None
        self.slot_logit = nn.Parameter(torch.zeros(H)) if b.slot_logit else None
        self.op = op_spec(a.op)
        self.length_scale = nn.Parameter(torch.full((H,), length_scale_init(cfg))) if self.op.length_scale else None
        self.feature_map = build_feature_map(a, dh)
        self.blocked_spec = blocked_spec(cfg)  # None: the op has no blocked path

    def _slots(self, k: Tensor, v: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """Keys and values [B, H, 1, d_h] (H: the heads of k) of the slots, in order."""
        B, H = k.shape[:2]
        keys, values = [], []
        if self.kv_slot is not None:
            ks, vs = self.kv_slot.keys_values(B, H)
            keys.append(ks.to(k.dtype))
            values.append(vs.to(v.dtype))
        if self.cfg.has_sink_logit:
            keys.append(k.new_zeros(B, H, 1, self.head_dim))
            values.append(v.new_zeros(B, H, 1, self.head_dim))
        return keys, values

    def _with_slots(self, k: Tensor, v: Tensor, ctx: AttentionContext):
        """The eager reference: the slots prepended; keys, values, additive mask [1, 1|H, Tq, S + Tk]."""
        keys, values = self._slots(k, v)
        base = ctx.additive_mask().to(k.dtype)
        if not keys:
            return k, v, base
        Tq = base.shape[2]
        columns = [k.new_zeros(1, 1, Tq, 1)] * (len(keys) - int(self.cfg.has_sink_logit))
        if self.slot_logit is not None:
            columns[0] = self.slot_logit.to(k.dtype)[None, :, None, None].expand(1, self.n_heads, Tq, 1)
        if self.cfg.has_sink_logit:
            logit = self.sink_logit if self.sink_logit is not None else k.new_zeros(self.n_heads)
            columns.append(logit.to(k.dtype)[None, :, None, None].expand(1, self.n_heads, Tq, 1))
        heads = max([base.shape[1]] + [c.shape[1] for c in columns])
        mask = torch.cat([c.expand(1, heads, Tq, 1) for c in columns] + [base.expand(1, heads, *base.shape[2:])], -1)
        return torch.cat(keys + [k], 2), torch.cat(values + [v], 2), mask

    def _augmented(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor, int]:
        """q, keys and values with the S slots as S leading keys, and S. A learned sink logit takes one
        more head dim (a multiple of 8 on CUDA): 1 in every query, s_h sqrt(d_h) in the sink key, else 0;
        being per query head, it needs keys per query head; so does the k*/v* slot's learned logit, likewise."""
        learned = [p for p in (self.slot_logit, self.sink_logit) if p is not None]
        if learned:
            k, v = expand_heads(k, self.n_heads), expand_heads(v, self.n_heads)
        keys, values = self._slots(k, v)
        if not keys:
            return q, k, v, 0
        S, (B, H, Tk) = len(keys), k.shape[:3]
        keys, values = torch.cat(keys + [k], 2), torch.cat(values + [v], 2)
        if learned:
            width = -(self.head_dim + 1) % 8 + 1 if q.is_cuda else 1
            slots = [k.new_zeros(H)] * S  # the logit of each slot: the k*/v* slot's first, the sink column's last
            if self.slot_logit is not None:
                slots[0] = self.slot_logit
            if self.sink_logit is not None:
                slots[-1] = self.sink_logit
            logit = (torch.stack(slots, -1) * self.head_dim**0.5).to(k.dtype)[None, :, :, None].expand(B, H, S, 1)
            column = F.pad(torch.cat([logit, k.new_zeros(B, H, Tk, 1)], 2), (0, width - 1))
            q = F.pad(q.transpose(1, 2), (0, width), value=1.0).transpose(1, 2)  # [B, T, H, d_h] as projected
            keys, values = torch.cat([keys, column], -1), F.pad(values, (0, width))
        return q, keys, values, S

    def forward(
        self, x: Tensor, ctx: AttentionContext, layer_cache=None, need_weights: bool = False, need_qkv: bool = False
    ) -> tuple[Tensor, AttentionCapture | None]:
        B, T, d = x.shape
        H, Hkv, dh = self.n_heads, self.n_kv_heads, self.head_dim
        heads = self.qkv(x).view(B, T, H + 2 * Hkv, dh).transpose(1, 2)  # [B, H + 2 Hkv, T, dh]
        q, k, v = heads.split((H, Hkv, Hkv), dim=1)  # [B, H, T, dh], [B, Hkv, T, dh] twice
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if layer_cache is not None:
            k, v = layer_cache.append(k, v)  # keys are cached before the rotation
        if ctx.rotary_q is not None:
            q = apply_rotary(q, *ctx.rotary_q)
            k = apply_rotary(k, *ctx.rotary_k)
        if self.length_scale is not None:  # SSMax: row i's logits times s_h log n_i, as a factor of q_i
            n_keys = ctx.n_admitted() + self.cfg.n_bias_slots  # [Tq]
            q = q * (self.length_scale[:, None, None] * n_keys.to(q.dtype).log()[:, None]).to(q.dtype)

        path, weights = self._path(ctx, layer_cache, need_weights), None
        if path != "sdpa":  # SDPA and flash-attn share each key/value head themselves
            k, v = expand_heads(k, H), expand_heads(v, H)
        if path == "sdpa":
            y = self._sdpa(*self._augmented(q, k, v), None if ctx.plain_causal else ctx.additive_mask())
        elif path == "blocked":
            slot_k = slot_v = None
            if self.kv_slot is not None:
                slot_k, slot_v = (t.to(q.dtype) for t in self.kv_slot.keys_values(B, self.n_heads))
            spec, phi = self.blocked_spec, self.feature_map
            y = blocked_attention(
                q, k, v, spec, feature_map=phi, slot_k=slot_k, slot_v=slot_v, score_bias=ctx.score_bias
            )
        else:
            keys, values, mask = self._with_slots(k, v, ctx)
            result = self.op.fn(q, keys, mask, self.cfg.attention, self.feature_map)
            y = result.weights.to(values.dtype) @ values
            weights = result.reported if need_weights else None
        if self.cfg.attention.alpha != 1.0:
            y = y * self.cfg.attention.alpha
        if self.value_bias is not None:
            y = y + self.value_bias[None, :, None, :].to(y.dtype)
        if self.gate is not None:  # scores [B, H, T, 1] (headwise) or [B, H, T, dh] (elementwise)
            y = y * torch.sigmoid(self.gate(x)).view(B, T, self.n_heads, -1).transpose(1, 2)
        capture = None
        if need_weights or need_qkv:
            k, v = expand_heads(k[:, :, -T:], H), expand_heads(v[:, :, -T:], H)  # what each query head reads
            qkv = (q, k, v) if need_qkv else (None, None, None)
            capture = AttentionCapture(weights, *qkv, y if need_weights else None)
        return self.out(self._merge(y)), capture

    def _path(self, ctx: AttentionContext, layer_cache, need_weights: bool) -> str:
        """ "sdpa", "blocked" (no learned bias, sink logit or cache) or "eager" (always for weights)."""
        if need_weights:
            return "eager"
        if self.op.sdpa and self.cfg.attention.p == 1.0:
            return "sdpa"
        learned_bias = ctx.score_bias is not None and ctx.score_bias.requires_grad
        if self.blocked_spec is not None and layer_cache is None and not self.cfg.has_sink_logit and not learned_bias:
            return "blocked"
        return "eager"

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, n_slots: int, mask: Tensor | None) -> Tensor:
        """Softmax attention over n_slots leading slot keys and the token keys; [B, H, Tq, d_h]. No mask:
        causal, by flash-attn's lower-right mask or SDPA's upper-left one with n_slots dummy query rows."""
        factor, dh, gqa = self.head_dim**-0.5, self.head_dim, k.shape[1] != q.shape[1]
        if mask is not None:
            mask = F.pad(mask.to(q.dtype), (n_slots, 0))  # the slots: admitted, no positional bias
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=factor, enable_gqa=gqa)[..., :dh]
        if flash_attn_func is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
            out = flash_attn_func(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=factor, causal=True
            )
            return out.transpose(1, 2)[..., :dh]
        if n_slots:  # laid out [B, T, H, d_h], as the projection lays q out: SDPA's output follows
            q = F.pad(q.transpose(1, 2), (0, 0, 0, 0, n_slots, 0)).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=factor, enable_gqa=gqa)
        return out[:, :, n_slots:, :dh]

    def _merge(self, y: Tensor) -> Tensor:
        """Concat (W_O: d x d) or sum over heads (W_O: d_h x d), Table 12 left."""
        if self.cfg.head_merge == "sum":
            return y.sum(dim=1)
        B, H, T, dh = y.shape
        return y.transpose(1, 2).reshape(B, T, H * dh)
