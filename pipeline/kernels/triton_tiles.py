"""Host side of the fused Triton tiles (``triton_kernels``), the GPU path of ``tiled_attention``:
two custom ops, ``sinklab::fused_tiles`` and its backward, with Z_i(S_i) and the bias slots in
torch (docs/gpu.md). Without a GPU set TRITON_INTERPRET=1 before this module is imported."""

from __future__ import annotations

import os
import uuid

import torch
from torch import Tensor

from .tiled import SIMILARITIES as TORCH_SIMILARITIES
from .tiled import MaskSpec, TileSpec, accumulator, normaliser, refuse_learned_bias
from .triton_kernels import MASKS, SIMILARITIES, triton

# block_q = block_k = 0 across the custom ops: the autotuned kernels pick the tiles
TUNED = 0


def tile_configs(full: bool) -> list:
    """Today's tiles first (64 x 64 narrow rows, 32 x 32 wide; 4 warps, 3 stages), then the ones tuning tries."""
    shapes = [(64, 64, 4, 3), (32, 32, 4, 3)]
    if full:
        shapes += [(64, 64, 4, 2), (128, 64, 8, 3), (64, 128, 8, 3), (128, 128, 8, 2), (128, 32, 4, 3)]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in shapes]


def _prune(configs, named_args, **kwargs):
    """Rows wider than 256 bytes keep today's 32 x 32 only; narrow rows drop it (docs/gpu.md)."""
    wide = kwargs["D"] * named_args["Q"].element_size() > 256
    return [c for c in configs if ((c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) == (32, 32)) == wide]


if triton is not None:  # one config under the interpreter (no timing there); keyed on (T, head dim, dtypes)
    import triton.language as tl

    from .triton_kernels import backward_kv, backward_q, forward

    tune = triton.autotune(
        configs=tile_configs(full=os.environ.get("TRITON_INTERPRET") != "1"),
        key=["Tq", "Tk", "D"],
        prune_configs_by={"early_config_prune": _prune},
    )
    forward_tuned, backward_kv_tuned, backward_q_tuned = map(tune, (forward, backward_kv, backward_q))
_REPORTED: set[tuple] = set()


def _launch(tuned, blocks: tuple[int, int], q: Tensor, k: Tensor, *args, **meta) -> None:
    """The kernel over the queries (the keys for backward_kv) in tiles of ``blocks``, autotuned when TUNED."""
    along, rows = ("BLOCK_N", k.shape[2]) if tuned is backward_kv_tuned else ("BLOCK_M", q.shape[2])
    grid = lambda config: (triton.cdiv(rows, config[along]), q.shape[0] * q.shape[1])
    args = (q, k, *args)
    if blocks[0] != TUNED:
        tuned.fn[grid](*args, **meta, BLOCK_M=blocks[0], BLOCK_N=blocks[1])
        return
    tuned[grid](*args, **meta)
    key = (tuned.base_fn.__name__, q.shape[2], k.shape[2], meta["D"], str(q.dtype))
    if os.environ.get("SINKLAB_REPORT_TILES") == "1" and key not in _REPORTED:  # gpu-check prints it
        _REPORTED.add(key)
        print(f"sinklab tiles: {key[0]} at T {key[1]} x {key[2]}, head dim {key[3]}, {key[4]}: {tuned.best_config}")


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


def _launch_args(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, spec: TileSpec):
    """Arguments shared by the three kernels (after the pointers)."""
    B, H, Tq, D = q.shape
    mask = spec.mask
    strides = [s for t in (q, k, v) for s in t.stride()[:3]]
    bias_strides = [0, 0] if bias is None else [bias.stride(0) if bias.shape[0] > 1 else 0, bias.stride(1)]
    scalars = [H, Tq, k.shape[2], mask.q_offset, mask.window, mask.prefix, *strides, *bias_strides]
    meta = dict(
        D=D,
        BLOCK_D=max(16, triton.next_power_of_2(D)),
        SIM=SIMILARITIES[spec.similarity],
        MASK=MASKS[mask.kind],
        HAS_BIAS=bias is not None,
        PRECISION="ieee" if q.dtype in (torch.float32, torch.float64) else "tf32",
        ACC=tl.float64 if q.dtype == torch.float64 else tl.float32,
        SCORE_FACTOR=spec.score_factor,
    )
    return scalars, meta


def default_blocks(head_dim: int, itemsize: int = 2) -> tuple[int, int]:
    """(queries, keys) per tile: 64 x 64 for rows of up to 256 bytes, else 32 x 32 (docs/gpu.md)."""
    return (64, 64) if head_dim * itemsize <= 256 else (32, 32)


def _prepare(q, k, v, bias, similarity, mask, window, prefix, q_offset, score_factor):
    """q, k, v with unit stride in their rows, bias contiguous, and the kernels' shared arguments."""
    # a TileSpec crosses the custom ops as (similarity, mask kind, window, prefix, q_offset, score_factor)
    spec = TileSpec(similarity=similarity, score_factor=score_factor, mask=MaskSpec(mask, window, prefix, q_offset))
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    bias = None if bias is None else bias.contiguous()
    return q, k, v, bias, *_launch_args(q, k, v, bias, spec)


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
    score_factor: float,
    block_q: int,
    block_k: int,
) -> tuple[Tensor, Tensor]:
    """(u, S) over the token keys."""
    q, k, v, bias, scalars, meta = _prepare(q, k, v, bias, similarity, mask, window, prefix, q_offset, score_factor)
    u, row_sum = _fused_tiles_fake(q)
    _launch(forward_tuned, (block_q, block_k), q, k, v, bias, u, row_sum, *scalars, **meta)
    return u, row_sum


@_fused_tiles.register_fake
def _fused_tiles_fake(q, *rest):
    return q.new_empty(q.shape, dtype=accumulator(q)), q.new_empty(q.shape[:3], dtype=accumulator(q))


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
    score_factor: float,
    block_q: int,
    block_k: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv (contiguous) from du and dS."""
    q, k, v, bias, scalars, meta = _prepare(q, k, v, bias, similarity, mask, window, prefix, q_offset, score_factor)
    du, d_row = (t.to(accumulator(q)).contiguous() for t in (du, d_row))
    dq, dk, dv = _fused_tiles_backward_fake(q, k, v)
    _launch(backward_kv_tuned, (block_q, block_k), q, k, v, bias, du, d_row, dk, dv, *scalars, **meta)
    _launch(backward_q_tuned, (block_q, block_k), q, k, v, bias, du, d_row, dq, *scalars, **meta)
    return dq, dk, dv


@_fused_tiles_backward.register_fake
def _fused_tiles_backward_fake(q, k, v, *rest):
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
    """``tiled_attention``'s [B, H, Tq, d_h] from the fused kernels; blocks: (queries, keys) per tile; both None: autotuned, one None: today's default."""
    if not supports(spec, score_bias):
        raise ValueError("fused_tiled_attention: needs triton, p = 1 and score_bias None or a tensor")
    refuse_learned_bias("fused_tiled_attention", score_bias)
    defaults = (TUNED, TUNED) if blocks == (None, None) else default_blocks(q.shape[-1], q.element_size())
    blocks = tuple(given or default for given, default in zip(blocks, defaults))
    m = spec.mask
    u, row_sum = _fused_tiles(
        q, k, v, score_bias, spec.similarity, m.kind, m.window, m.prefix, m.q_offset, spec.score_factor, *blocks
    )
    if slot_k is not None:  # bias slots: admitted for every query, no positional bias
        sim, _ = TORCH_SIMILARITIES[spec.similarity]((q @ slot_k.transpose(-2, -1)).to(u.dtype) * spec.score_factor)
        u = u + sim @ slot_v.to(u.dtype)
        row_sum = row_sum + sim.sum(-1)
    return (u / normaliser(row_sum, spec.normalizer)[..., None]).to(q.dtype)
