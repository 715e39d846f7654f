"""Host side of the fused Triton tiles (``triton_kernels``), the GPU path of ``tiled_attention``:
two custom ops, ``sinklab::fused_tiles`` and its backward, with Z_i(S_i) and the bias slots in
torch (docs/gpu.md). Without a GPU set TRITON_INTERPRET=1 before this module is imported."""

from __future__ import annotations

import uuid

import torch
from torch import Tensor

from .tiled import MaskSpec, TileSpec, accumulator, normaliser, refuse_learned_bias, similarity_and_grad
from .triton_kernels import MASKS, SIMILARITIES, triton

if triton is not None:
    import triton.language as tl

    from .triton_kernels import backward_kv, backward_q, forward


def available() -> bool:
    return triton is not None


def supports(spec: TileSpec, score_bias) -> bool:
    """Whether the fused kernels compute this spec (p = 1, a Triton similarity, a bias tensor or none)."""
    return (
        available()
        and spec.p == 1.0
        and spec.similarity in SIMILARITIES
        and (score_bias is None or isinstance(score_bias, Tensor))
    )


def _launch_args(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, spec: TileSpec, blocks: tuple[int, int]):
    """Arguments shared by the three kernels (after the pointers)."""
    B, H, Tq, D = q.shape
    mask: MaskSpec = spec.mask
    strides = [s for t in (q, k, v) for s in t.stride()[:3]]
    bias_strides = [0, 0] if bias is None else [bias.stride(0) if bias.shape[0] > 1 else 0, bias.stride(1)]
    scalars = [H, Tq, k.shape[2], mask.q_offset, mask.window, mask.prefix, *strides, *bias_strides]
    wide = q.dtype in (torch.float32, torch.float64)
    meta = dict(
        D=D,
        BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=blocks[0],
        BLOCK_N=blocks[1],
        SIM=SIMILARITIES[spec.similarity],
        MASK=MASKS[mask.kind],
        HAS_BIAS=bias is not None,
        PRECISION="ieee" if wide else "tf32",
        ACC=tl.float64 if q.dtype == torch.float64 else tl.float32,
        SCALE=spec.scale,
    )
    return scalars, meta


def default_blocks(head_dim: int, itemsize: int = 2) -> tuple[int, int]:
    """(queries, keys) per tile: 64 x 64 for rows of up to 256 bytes, else 32 x 32 (docs/gpu.md)."""
    return (64, 64) if head_dim * itemsize <= 256 else (32, 32)


def _prepare(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, *spec_and_blocks):
    """q, k, v with unit stride in their rows, bias contiguous, and the kernels' shared arguments."""
    # a TileSpec crosses the custom ops as (similarity, mask kind, window, prefix, q_offset, scale)
    similarity, mask, window, prefix, q_offset, scale, block_q, block_k = spec_and_blocks
    spec = TileSpec(similarity=similarity, scale=scale, mask=MaskSpec(mask, window, prefix, q_offset))
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    bias = None if bias is None else bias.contiguous()
    return q, k, v, bias, *_launch_args(q, k, v, bias, spec, (block_q, block_k))


# An export's bundled copy of this module gets a namespace of its own (docs/gpu.md).
_NAMESPACE = "sinklab" if __name__.startswith("pipeline.") else f"sinklab_{uuid.uuid4().hex}"


@torch.library.custom_op(f"{_NAMESPACE}::fused_tiles", mutates_args=())
def _fused_tiles(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    similarity: str,
    mask: str,
    window: int,
    prefix: int,
    q_offset: int,
    scale: float,
    block_q: int,
    block_k: int,
) -> tuple[Tensor, Tensor]:
    """(u, S) over the token keys."""
    spec_and_blocks = (similarity, mask, window, prefix, q_offset, scale, block_q, block_k)
    q, k, v, bias, scalars, meta = _prepare(q, k, v, bias, *spec_and_blocks)
    B, H, Tq, D = q.shape
    u = q.new_empty(B, H, Tq, D, dtype=accumulator(q))
    row_sum = q.new_empty(B, H, Tq, dtype=accumulator(q))
    forward[(triton.cdiv(Tq, block_q), B * H)](q, k, v, bias, u, row_sum, *scalars, **meta)
    return u, row_sum


@_fused_tiles.register_fake
def _(q, k, v, bias, *spec_and_blocks):
    B, H, Tq, D = q.shape
    return q.new_empty(B, H, Tq, D, dtype=accumulator(q)), q.new_empty(B, H, Tq, dtype=accumulator(q))


@torch.library.custom_op(f"{_NAMESPACE}::fused_tiles_backward", mutates_args=())
def _fused_tiles_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    du: Tensor,
    d_row: Tensor,
    similarity: str,
    mask: str,
    window: int,
    prefix: int,
    q_offset: int,
    scale: float,
    block_q: int,
    block_k: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv (contiguous) from du and dS."""
    spec_and_blocks = (similarity, mask, window, prefix, q_offset, scale, block_q, block_k)
    q, k, v, bias, scalars, meta = _prepare(q, k, v, bias, *spec_and_blocks)
    B, H, Tq, D = q.shape
    acc = accumulator(q)
    du, d_row = du.to(acc).contiguous(), d_row.to(acc).contiguous()
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    backward_kv[(triton.cdiv(k.shape[2], block_k), B * H)](q, k, v, bias, du, d_row, dk, dv, *scalars, **meta)
    backward_q[(triton.cdiv(Tq, block_q), B * H)](q, k, v, bias, du, d_row, dq, *scalars, **meta)
    return dq, dk, dv


@_fused_tiles_backward.register_fake
def _(q, k, v, *rest):
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))


def _save_inputs(ctx, inputs, output) -> None:
    q, k, v, bias, *ctx.spec_and_blocks = inputs
    ctx.save_for_backward(q, k, v, bias)


def _fused_tiles_grad(ctx, du, d_row):
    q, k, v, bias = ctx.saved_tensors
    acc = accumulator(q)
    du = torch.zeros_like(q, dtype=acc) if du is None else du
    d_row = q.new_zeros(q.shape[:3], dtype=acc) if d_row is None else d_row
    dq, dk, dv = _fused_tiles_backward(q, k, v, bias, du, d_row, *ctx.spec_and_blocks)
    return dq, dk, dv, None, *(None for _ in ctx.spec_and_blocks)


_fused_tiles.register_autograd(_fused_tiles_grad, setup_context=_save_inputs)


def fused_tiled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    spec: TileSpec,
    slot_k: Tensor | None = None,
    slot_v: Tensor | None = None,
    score_bias: Tensor | None = None,
    blocks: tuple[int | None, int | None] = (None, None),
) -> Tensor:
    """``tiled_attention``'s [B, H, Tq, d_h] from the fused kernels; blocks: (queries, keys) per tile, None: default."""
    if not supports(spec, score_bias):
        raise ValueError("fused_tiled_attention: needs triton, p = 1 and score_bias None or a tensor")
    if score_bias is not None:
        refuse_learned_bias("fused_tiled_attention", score_bias)
    default_q, default_k = default_blocks(q.shape[-1], q.element_size())
    blocks = (blocks[0] or default_q, blocks[1] or default_k)
    m = spec.mask
    u, row_sum = _fused_tiles(
        q, k, v, score_bias, spec.similarity, m.kind, m.window, m.prefix, m.q_offset, spec.scale, *blocks
    )
    if slot_k is not None:  # bias slots: admitted for every query, no positional bias
        sim, _ = similarity_and_grad((q @ slot_k.transpose(-2, -1)).to(u.dtype) * spec.scale, spec.similarity)
        u = u + sim @ slot_v.to(u.dtype)
        row_sum = row_sum + sim.sum(-1)
    return (u / normaliser(row_sum, spec.normalizer)[..., None]).to(q.dtype)
