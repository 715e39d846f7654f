"""`--model.compile true` for every attention family: each block compiled whole (fullgraph, so a
graph break fails), loss and every gradient equal to the eager model's. On a CPU the blocked ops
take the torch tiles unless told otherwise; the fused Triton tiles (the CUDA path) are forced
here under Triton's interpreter, where they run inside their custom ops like on a GPU."""

from __future__ import annotations

import pytest
import torch

import pipeline.model.attention as attention_module
from pipeline.kernels import triton_tiles
from pipeline.model import ModelConfig, Transformer
from pipeline.model.attention_ops import OPS
from pipeline.train.loss import next_token_loss

# every op with its first declared normalizer (not every op accepts the config's default)
FAMILIES = {name: dict(op=name, normalizer=spec.normalizers[0]) for name, spec in OPS.items()} | {
    "sigmoid-none": dict(op="sigmoid", normalizer="none"),  # Table 6's variant (the blocked tiles)
    "kernel": dict(op="kernel", feature_map="elu1", normalizer="sum"),  # linear: the chunked form
    "kernel-mlp": dict(op="kernel", feature_map="mlp", normalizer="abs_clamp"),
}


def _loss_and_grads(model: Transformer, tokens: torch.Tensor):
    model.zero_grad(set_to_none=True)
    loss = next_token_loss(model, tokens, 0)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _compiled_matches_eager(attention: dict, backend: str) -> None:
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("micro", vocab_size=64, init_std=0.2, attention=attention))
    tokens = torch.randint(0, 64, (2, 21))
    loss, grads = _loss_and_grads(model, tokens)
    torch._dynamo.reset()
    for block in model.blocks:
        block.compile(backend=backend, fullgraph=True)
    loss_c, grads_c = _loss_and_grads(model, tokens)
    torch.testing.assert_close(loss_c, loss, rtol=1e-5, atol=1e-6)
    assert grads_c.keys() == grads.keys()
    for name in grads:
        torch.testing.assert_close(grads_c[name], grads[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_attention_family_compiles_without_graph_breaks(family):
    """Dynamo and AOTAutograd over forward and backward (aot_eager: Inductor's code generation,
    slow on a CPU, is covered by the next test and by tests/train/test_module.py)."""
    _compiled_matches_eager(FAMILIES[family], "aot_eager")


@pytest.mark.skipif(not triton_tiles.available(), reason="triton is not installed")
def test_fused_triton_tiles_inside_an_inductor_compiled_model(monkeypatch):
    """The sigmoid model as a GPU trains it: the fused kernels inside a block Inductor compiled."""
    real, calls = attention_module.blocked_attention, []
    monkeypatch.setattr(
        attention_module, "blocked_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw, impl="triton")
    )
    _compiled_matches_eager(dict(op="sigmoid", normalizer="none"), "inductor")
    assert calls
