"""The autotuned fused tiles (pipeline/kernels/triton_tiles.py) under Triton's interpreter, where one
config is tried: today's tiles, the same numbers as explicit blocks, and the choice reported."""

from __future__ import annotations

import pytest
import torch

from pipeline.kernels import triton_tiles
from pipeline.kernels.tiled import MaskSpec, TileSpec

pytestmark = pytest.mark.skipif(not triton_tiles.available(), reason="triton is not installed")


def shapes(configs) -> list[tuple[int, int, int, int]]:
    return [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in configs]


def test_todays_tiles_come_first_and_the_interpreter_tries_only_them():
    full = shapes(triton_tiles.tile_configs(full=True))
    assert full[:2] == [(64, 64, 4, 3), (32, 32, 4, 3)] and len(set(full)) == len(full) > 4
    configs = triton_tiles.tile_configs(full=True)
    narrow, wide = torch.empty(1, dtype=torch.bfloat16), torch.empty(1, dtype=torch.float32)
    assert shapes(triton_tiles._prune(configs, {"Q": wide}, D=128)) == [(32, 32, 4, 3)]  # 512-byte rows
    assert (32, 32, 4, 3) not in shapes(triton_tiles._prune(configs, {"Q": narrow}, D=128))
    interpreted = triton_tiles.forward_tuned.configs
    for q, d in ((narrow, 64), (wide, 16), (wide, 128)):
        assert len(triton_tiles._prune(interpreted, {"Q": q}, D=d)) == 1


@pytest.mark.parametrize("head_dim, tiles", [(16, "BLOCK_M: 64, BLOCK_N: 64"), (80, "BLOCK_M: 32, BLOCK_N: 32")])
def test_tuned_tiles_give_the_explicit_tiles_numbers_and_are_reported(head_dim, tiles, monkeypatch, capsys):
    monkeypatch.setenv("SINKLAB_REPORT_TILES", "1")
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 9, head_dim, requires_grad=True) for _ in range(3))
    spec = TileSpec(similarity="sigmoid", normalizer="none", score_factor=head_dim**-0.5, mask=MaskSpec("causal"))
    grads = []
    for blocks in ((None, None), triton_tiles.default_blocks(head_dim, 4)):
        out = triton_tiles.fused_tiled_attention(q, k, v, spec, blocks=blocks)
        grads.append((out, *torch.autograd.grad(out.square().sum(), (q, k, v))))
    for tuned, explicit in zip(*grads):
        torch.testing.assert_close(tuned, explicit, rtol=0, atol=0)
    report = capsys.readouterr().out
    for kernel in ("forward", "backward_kv", "backward_q"):
        assert f"sinklab tiles: {kernel} at T 9 x 9, head dim {head_dim}, torch.float32: {tiles}" in report
    assert "num_warps: 4" in report and "num_stages: 3" in report
