"""Fused Triton tiles for element-wise attention (sigmoid, elu+1, kernel dot products): the GPU
path of ``tiled_attention``.

One program per (query block, batch x head) streams key blocks through on-chip memory and
keeps only, over the admitted token keys,

    u_i = sum_j sim_ij v_j,    S_i = sum_j sim_ij,    sim_ij = f(q_i k_j^T * scale + b_ij)

Unlike softmax there is no running maximum to rescale by: the similarities are summed as they
come. Backward recomputes each tile and splits the work like FlashAttention-2 (one kernel
over key blocks for dk and dv, one over query blocks for dq; no atomics), with

    dsim_ij = du_i . v_j + dS_i,   ds_ij = dsim_ij f'(s_ij),
    dq = scale ds k,   dk = scale ds^T q,   dv = sim^T du.

The normaliser Z_i(S_i) and the bias slots (k*, v*) are O(T d) and stay in torch around the
kernels, so autograd handles them. The kernels launch inside two custom ops
(``sinklab::fused_tiles`` and its backward), so a compiled model calls them as they are, and the
only float they take, the scale, is a compile-time constant: torch.compile may type a float
argument fp64, which would make the sums fp64 (the Triton compiler then refuses the loop). On a
machine without a GPU the kernels run (slowly, for tests) under Triton's interpreter: set
TRITON_INTERPRET=1 before this module is imported.
"""

from __future__ import annotations

import uuid

import torch
from torch import Tensor

from .tiled import MaskSpec, TileSpec, normaliser, similarity_and_grad

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the machine
    triton = None

SIMILARITIES = {"sigmoid": 0, "elu1": 1, "identity": 2}
MASKS = {"causal": 0, "prefix": 1, "sliding": 2}


def available() -> bool:
    return triton is not None


def supports(spec: TileSpec, score_bias) -> bool:
    """Whether the fused kernels compute this spec: p-norms, per-tile bias functions and
    similarities without a Triton form stay on the torch tiles (a bias must be the model's
    [1|H, Tq, Tk] tensor)."""
    return (
        available()
        and spec.p == 1.0
        and spec.similarity in SIMILARITIES
        and (score_bias is None or isinstance(score_bias, Tensor))
    )


if triton is not None:

    @triton.jit
    def _sim(s, SIM: tl.constexpr):
        """f(s) and f'(s) in fp32."""
        if SIM == 0:
            sim = tl.sigmoid(s)
            grad = sim * (1.0 - sim)
        elif SIM == 1:
            sim = tl.where(s > 0, s + 1.0, tl.exp(tl.minimum(s, 0.0)))
            grad = tl.where(s > 0, 1.0, sim)
        else:
            sim = s
            grad = s * 0.0 + 1.0
        return sim, grad

    @triton.jit
    def _admitted(q_slot, k_slot, Tq_end, Tk, window, prefix, MASK: tl.constexpr):
        """The model's mask (masks.admitted_pairs) for query slots x key slots, inside bounds."""
        qi, kj = q_slot[:, None], k_slot[None, :]
        ok = kj <= qi
        if MASK == 1:
            ok = ok | ((qi < prefix) & (kj < prefix))
        if MASK == 2:
            ok = ok & (qi - kj < window)
        return ok & (qi < Tq_end) & (kj < Tk)

    @triton.jit
    def _key_range(q_lo, q_hi, Tk, window, prefix, MASK: tl.constexpr):
        """Key slots [lo, hi) that some query slot in [q_lo, q_hi) sees (MaskSpec.key_range)."""
        hi = q_hi
        if MASK == 1:
            hi = tl.maximum(hi, prefix)
        lo = q_lo * 0
        if MASK == 2:
            lo = tl.maximum(q_lo - window + 1, 0)
        return lo, tl.minimum(hi, Tk)

    @triton.jit
    def _query_range(k_lo, k_hi, q_offset, Tk, window, prefix, MASK: tl.constexpr):
        """Query slots [lo, hi) that see some key slot in [k_lo, k_hi) (MaskSpec.query_range)."""
        lo = tl.maximum(k_lo, q_offset)
        if MASK == 1:
            lo = tl.where(k_lo < prefix, q_offset, lo)
        hi = Tk
        if MASK == 2:
            hi = tl.minimum(Tk, k_hi + window - 1)
        return lo, hi

    @triton.jit
    def _scores(
        q,
        k,
        BIAS,
        bias_off,
        offs_m,
        offs_n,
        ok,
        scale: tl.constexpr,
        sbq,
        HAS_BIAS: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        if HAS_BIAS:
            s += tl.load(BIAS + bias_off + offs_m[:, None] * sbq + offs_n[None, :], mask=ok, other=0.0).to(s.dtype)
        return s

    @triton.jit
    def _load_rows(P, base, offs, stride, n, offs_d, D):
        """Rows ``offs`` (< n) of a [n, D] matrix at P + base with row stride ``stride``; zeros outside."""
        return tl.load(
            P + base + offs[:, None] * stride + offs_d[None, :],
            mask=(offs[:, None] < n) & (offs_d[None, :] < D),
            other=0.0,
        )

    @triton.jit
    def _tile_grads(
        q,
        k,
        v,
        du,
        d_row,
        BIAS,
        bias_off,
        offs_m,
        offs_n,
        ok,
        scale: tl.constexpr,
        sbq,
        SIM: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        """A tile's sim and ds = (du v^T + dS) f'(s), both zero off the mask."""
        s = _scores(q, k, BIAS, bias_off, offs_m, offs_n, ok, scale, sbq, HAS_BIAS, PRECISION)
        sim, grad = _sim(s, SIM)
        dsim = tl.dot(du, tl.trans(v), input_precision=PRECISION) + d_row[:, None]
        return tl.where(ok, sim, 0.0), tl.where(ok, dsim * grad, 0.0)

    @triton.jit
    def _forward(
        Q,
        K,
        V,
        BIAS,
        U,
        S,
        H,
        Tq,
        Tk,
        q_offset,
        window,
        prefix,
        sqb,
        sqh,
        sqt,
        skb,
        skh,
        skt,
        svb,
        svh,
        svt,
        sbh,
        sbq,
        D: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SIM: tl.constexpr,
        MASK: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        PRECISION: tl.constexpr,
        ACC: tl.constexpr,
        SCALE: tl.constexpr,
    ):
        pid_m, bh = tl.program_id(0), tl.program_id(1)
        b, h = bh // H, bh % H
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        q = _load_rows(Q, b * sqb + h * sqh, offs_m, sqt, Tq, offs_d, D)
        q_slot = offs_m + q_offset
        lo, hi = _key_range(
            pid_m * BLOCK_M + q_offset, tl.minimum(pid_m * BLOCK_M + BLOCK_M, Tq) + q_offset, Tk, window, prefix, MASK
        )
        u = tl.zeros([BLOCK_M, BLOCK_D], dtype=ACC)
        row_sum = tl.zeros([BLOCK_M], dtype=ACC)
        for start in range(lo, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            k = _load_rows(K, b * skb + h * skh, offs_n, skt, Tk, offs_d, D)
            v = _load_rows(V, b * svb + h * svh, offs_n, svt, Tk, offs_d, D)
            ok = _admitted(q_slot, offs_n, Tq + q_offset, Tk, window, prefix, MASK)
            s = _scores(q, k, BIAS, h * sbh, offs_m, offs_n, ok, SCALE, sbq, HAS_BIAS, PRECISION)
            sim, _ = _sim(s, SIM)
            sim = tl.where(ok, sim, 0.0)
            u += tl.dot(sim.to(v.dtype), v, input_precision=PRECISION)
            row_sum += tl.sum(sim, 1)
        out = bh * Tq + offs_m
        tl.store(U + out[:, None] * D + offs_d[None, :], u, mask=(offs_m[:, None] < Tq) & (offs_d[None, :] < D))
        tl.store(S + out, row_sum, mask=offs_m < Tq)

    @triton.jit
    def _backward_kv(
        Q,
        K,
        V,
        BIAS,
        DU,
        DS,
        DK,
        DV,
        H,
        Tq,
        Tk,
        q_offset,
        window,
        prefix,
        sqb,
        sqh,
        sqt,
        skb,
        skh,
        skt,
        svb,
        svh,
        svt,
        sbh,
        sbq,
        D: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SIM: tl.constexpr,
        MASK: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        PRECISION: tl.constexpr,
        ACC: tl.constexpr,
        SCALE: tl.constexpr,
    ):
        pid_n, bh = tl.program_id(0), tl.program_id(1)
        b, h = bh // H, bh % H
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        k = _load_rows(K, b * skb + h * skh, offs_n, skt, Tk, offs_d, D)
        v = _load_rows(V, b * svb + h * svh, offs_n, svt, Tk, offs_d, D)
        lo, hi = _query_range(
            pid_n * BLOCK_N, tl.minimum(pid_n * BLOCK_N + BLOCK_N, Tk), q_offset, Tk, window, prefix, MASK
        )
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC)
        dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=ACC)
        for start in range(lo - q_offset, hi - q_offset, BLOCK_M):
            offs_m = start + tl.arange(0, BLOCK_M)
            q = _load_rows(Q, b * sqb + h * sqh, offs_m, sqt, Tq, offs_d, D)
            du = _load_rows(DU, bh * Tq * D, offs_m, D, Tq, offs_d, D).to(q.dtype)
            d_row = tl.load(DS + bh * Tq + offs_m, mask=offs_m < Tq, other=0.0)
            ok = _admitted(offs_m + q_offset, offs_n, Tq + q_offset, Tk, window, prefix, MASK)
            sim, ds = _tile_grads(
                q, k, v, du, d_row, BIAS, h * sbh, offs_m, offs_n, ok, SCALE, sbq, SIM, HAS_BIAS, PRECISION
            )
            dv += tl.dot(tl.trans(sim.to(q.dtype)), du, input_precision=PRECISION)
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
        kv_ok = (offs_n[:, None] < Tk) & (offs_d[None, :] < D)
        out = bh * Tk + offs_n
        tl.store(DK + out[:, None] * D + offs_d[None, :], dk * SCALE, mask=kv_ok)
        tl.store(DV + out[:, None] * D + offs_d[None, :], dv, mask=kv_ok)

    @triton.jit
    def _backward_q(
        Q,
        K,
        V,
        BIAS,
        DU,
        DS,
        DQ,
        H,
        Tq,
        Tk,
        q_offset,
        window,
        prefix,
        sqb,
        sqh,
        sqt,
        skb,
        skh,
        skt,
        svb,
        svh,
        svt,
        sbh,
        sbq,
        D: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        SIM: tl.constexpr,
        MASK: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        PRECISION: tl.constexpr,
        ACC: tl.constexpr,
        SCALE: tl.constexpr,
    ):
        pid_m, bh = tl.program_id(0), tl.program_id(1)
        b, h = bh // H, bh % H
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        q = _load_rows(Q, b * sqb + h * sqh, offs_m, sqt, Tq, offs_d, D)
        du = _load_rows(DU, bh * Tq * D, offs_m, D, Tq, offs_d, D).to(q.dtype)
        d_row = tl.load(DS + bh * Tq + offs_m, mask=offs_m < Tq, other=0.0)
        lo, hi = _key_range(
            pid_m * BLOCK_M + q_offset, tl.minimum(pid_m * BLOCK_M + BLOCK_M, Tq) + q_offset, Tk, window, prefix, MASK
        )
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=ACC)
        for start in range(lo, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            k = _load_rows(K, b * skb + h * skh, offs_n, skt, Tk, offs_d, D)
            v = _load_rows(V, b * svb + h * svh, offs_n, svt, Tk, offs_d, D)
            ok = _admitted(offs_m + q_offset, offs_n, Tq + q_offset, Tk, window, prefix, MASK)
            _, ds = _tile_grads(
                q, k, v, du, d_row, BIAS, h * sbh, offs_m, offs_n, ok, SCALE, sbq, SIM, HAS_BIAS, PRECISION
            )
            dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
        rows = bh * Tq + offs_m
        tl.store(
            DQ + rows[:, None] * D + offs_d[None, :], dq * SCALE, mask=(offs_m[:, None] < Tq) & (offs_d[None, :] < D)
        )


def accumulator(q: Tensor) -> torch.dtype:
    """fp32 sums for fp32/bf16/fp16 inputs; fp64 stays fp64 (tests compare to 1e-9)."""
    return torch.promote_types(q.dtype, torch.float32)


def _launch_args(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, spec: TileSpec, blocks: tuple[int, int]):
    """Arguments shared by the three kernels (after the pointers)."""
    B, H, Tq, D = q.shape
    mask: MaskSpec = spec.mask
    strides = [s for t in (q, k, v) for s in t.stride()[:3]]
    if bias is None:
        bias_strides = [0, 0]
    else:
        bias_strides = [bias.stride(0) if bias.shape[0] > 1 else 0, bias.stride(1)]
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
    """(queries, keys) per tile. 64 x 64 keeps the bf16 tiles of q, k, v and du for head dims
    up to 128 (and their pipelined copies) within a Hopper SM's shared memory; wider rows (fp32
    and up) take 32 x 32. Tests pass 16 x 16 (the smallest tl.dot) to cover many tiles."""
    return (64, 64) if head_dim * itemsize <= 256 else (32, 32)


# The kernels run inside two custom ops (forward, backward), opaque to torch.compile: Dynamo
# neither breaks the graph at them nor traces into them, and Triton's own JIT compiles them.
# A TileSpec travels as its kernel fields: (similarity, mask kind, window, prefix, q_offset, scale).
def _tile_spec(similarity: str, mask: str, window: int, prefix: int, q_offset: int, scale: float) -> TileSpec:
    return TileSpec(similarity=similarity, scale=scale, mask=MaskSpec(mask, window, prefix, q_offset))


def _rows_contiguous(*tensors: Tensor) -> list[Tensor]:
    return [t.contiguous() if t is not None and t.stride(-1) != 1 else t for t in tensors]


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
    """(u, S) over the token keys; see the module docstring."""
    q, k, v = _rows_contiguous(q, k, v)
    bias = None if bias is None else bias.contiguous()
    B, H, Tq, D = q.shape
    u = q.new_empty(B, H, Tq, D, dtype=accumulator(q))
    row_sum = q.new_empty(B, H, Tq, dtype=accumulator(q))
    spec = _tile_spec(similarity, mask, window, prefix, q_offset, scale)
    scalars, meta = _launch_args(q, k, v, bias, spec, (block_q, block_k))
    _forward[(triton.cdiv(Tq, block_q), B * H)](q, k, v, bias, u, row_sum, *scalars, **meta)
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
    q, k, v = _rows_contiguous(q, k, v)
    bias = None if bias is None else bias.contiguous()
    B, H, Tq, D = q.shape
    acc = accumulator(q)
    du, d_row = du.to(acc).contiguous(), d_row.to(acc).contiguous()
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    spec = _tile_spec(similarity, mask, window, prefix, q_offset, scale)
    scalars, meta = _launch_args(q, k, v, bias, spec, (block_q, block_k))
    _backward_kv[(triton.cdiv(k.shape[2], block_k), B * H)](q, k, v, bias, du, d_row, dk, dv, *scalars, **meta)
    _backward_q[(triton.cdiv(Tq, block_q), B * H)](q, k, v, bias, du, d_row, dq, *scalars, **meta)
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
    """What ``tiled_attention`` returns, from the fused kernels: [B, H, Tq, d_h]. blocks:
    (queries, keys) per tile, None for ``default_blocks``."""
    if not supports(spec, score_bias):
        raise ValueError("fused_tiled_attention: needs triton, p = 1 and score_bias None or a tensor")
    if score_bias is not None and score_bias.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            "fused_tiled_attention: score_bias needs gradients (a learned bias such as T5's); "
            "use the eager attention path for it"
        )
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
    return (u / normaliser(row_sum, None, spec)[..., None]).to(q.dtype)
