"""The key slots on a CUDA device: bf16 through SDPA's flash kernel (the only backend allowed) against the
eager path that builds the dense mask, both measured from a float32 eager reference. Run by gpu-check's
slots-cuda case; skipped without CUDA."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from pipeline.model import ModelConfig, Transformer

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (bf16 through SDPA's flash kernel); gpu-check runs it"
)
SLOTS = {
    "sink_logit": {"attention": {"sink_logit": True}},
    "off_by_one": {"attention": {"op": "softmax_off_by_one"}},
    "k_fixed_value": {"biases": {"kind": "k", "value_norm": 3.0}},
    "kv": {"biases": {"kind": "kv"}},
    "kv_shared_and_sink_logit": {"biases": {"kind": "kv", "shared_heads": True}, "attention": {"sink_logit": True}},
}
SHAPE = dict(d_model=128, n_heads=2, n_layers=2, d_ffn=256, max_seq_len=512)


def _model(overrides: dict, sink_tokens: int) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("micro", init_std=0.2, sink_tokens=sink_tokens, **SHAPE, **overrides))
    with torch.no_grad():  # slots that take a real share of attention
        for name, p in model.named_parameters():
            if name.endswith("sink_logit") or "kv_slot" in name:
                p.copy_(2.0 * torch.randn_like(p) + 1.0)
    return model.cuda()


def _logits_and_grads(model: Transformer, idx: torch.Tensor, eager: bool):
    model.zero_grad(set_to_none=True)
    logits = model(idx, output_attentions=eager).logits
    logits.float().square().mean().backward()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.float().detach(), grads


def _error(x: torch.Tensor, reference: torch.Tensor) -> float:
    return ((x - reference).norm() / reference.norm().clamp_min(1e-12)).item()


@pytest.mark.parametrize("sink_tokens", [0, 2])
@pytest.mark.parametrize("slot", sorted(SLOTS))
def test_flash_path_in_bf16_is_as_close_to_float32_as_the_eager_path(slot, sink_tokens):
    model = _model(SLOTS[slot], sink_tokens)
    idx = torch.randint(0, 64, (2, 384), generator=torch.Generator().manual_seed(1)).cuda()
    reference, reference_grads = _logits_and_grads(model, idx, eager=True)
    model = model.bfloat16()
    eager, eager_grads = _logits_and_grads(model, idx, eager=True)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # refuses to fall back: the flash kernel or an error
        flash, flash_grads = _logits_and_grads(model, idx, eager=False)
    assert _error(flash, reference) <= 2 * _error(eager, reference) + 1e-3
    slot_params = [n for n in reference_grads if n.endswith(("sink_logit", "kv_slot.key", "kv_slot.value"))]
    assert slot_params or slot == "off_by_one"
    for name in [*slot_params, "blocks.0.attn.qkv.weight"]:
        bound = 2 * _error(eager_grads[name], reference_grads[name]) + 1e-2
        assert _error(flash_grads[name], reference_grads[name]) <= bound, name
