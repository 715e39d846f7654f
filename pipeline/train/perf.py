"""Training FLOPs and model FLOPs utilisation (MFU).

FLOPs per trained token (forward + backward, PaLM appendix B convention):

    F = 6 N + 12 L d C

N = parameters that take part in matrix multiplies: everything except the input embedding
table (the LM head counts; tied embeddings count once, as the head). The second term is the
attention score and weighted-value products, 2 matmuls x 2 FLOPs x 3 (fwd + bwd) x L layers x
d (= H x d_head) x C keys, counted over the full C x C square as PaLM does; a causal kernel does
about half of it, so MFU by this formula is comparable with published figures, not a measure of
wasted work. Learnable sink tokens and bias slots add C+S keys; they are ignored (S << C).

MFU = achieved FLOPs/s / peak dense bf16 FLOPs/s of the device (table below, per GPU).
"""
from __future__ import annotations

import torch

# Dense (no sparsity) bf16 tensor-core peaks, FLOP/s per device, from the vendors' data sheets.
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100 SXM": 989e12,
    "H100 NVL": 835e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 70e12,
}


def matmul_params(model: torch.nn.Module) -> int:
    """N in the formula: all parameters minus the input embedding table (unless tied to the head)."""
    n = sum(p.numel() for p in model.parameters())
    embed = getattr(model, "embed", None)
    tied = getattr(getattr(model, "config", None), "tie_embeddings", False)
    if embed is not None and not tied:
        n -= embed.weight.numel()
    return n


def flops_per_token(n_matmul_params: int, n_layers: int, d_model: int, context_length: int) -> float:
    return 6.0 * n_matmul_params + 12.0 * n_layers * d_model * context_length


def device_peak_flops(device: torch.device | None = None) -> float | None:
    """Peak bf16 FLOP/s of a CUDA device by name; None on CPU or an unknown GPU (MFU not logged)."""
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if key.replace(" ", "").lower() in name.replace(" ", "").lower():
            return PEAK_BF16_FLOPS[key]
    return None


def mfu(tokens_per_s_per_device: float, flops_token: float, peak: float | None) -> float | None:
    return None if not peak else tokens_per_s_per_device * flops_token / peak
