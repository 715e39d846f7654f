"""Model FLOPs per trained token, device peaks and model FLOPs utilisation (MFU); pure functions.

Forward + backward, recomputation not counted (docs/gpu.md defines each term):

    F_token = [ 6 (C + S) N_blocks  +  6 C N_head  +  12 L d P ] / C
"""

from __future__ import annotations

import os
import re
from typing import Literal

from pipeline.model.attention_ops import op_spec
from pipeline.model.config import ModelConfig

Convention = Literal["exact", "palm"]
PEAK_ENV = "SINKLAB_PEAK_TFLOPS"

# (regex on torch.cuda.get_device_name(), label, dense bf16 TFLOP/s from the data sheet): the first match wins
DEVICE_PEAK_TFLOPS: list[tuple[str, str, float]] = [
    (r"H100.*PCIE", "H100 PCIe", 756.0),
    (r"H100.*NVL", "H100 NVL", 835.0),
    (r"H100|H800", "H100 SXM", 989.0),
    (r"H200.*NVL", "H200 NVL", 835.0),
    (r"GH200|H200", "H200 SXM / GH200", 989.0),
    (r"B200", "B200", 2250.0),
    (r"A100|A800", "A100", 312.0),
    (r"L40S", "L40S", 362.0),
    (r"\bL4\b", "L4", 121.0),
    (r"\bA10\b", "A10", 125.0),
    (r"MI300X", "MI300X", 1307.0),
]


def matmul_params_per_token(config: ModelConfig) -> tuple[float, float]:
    """(N_blocks, N_head): weights each token multiplies in the blocks and in the LM head."""
    d, L, H, f, V = config.d_model, config.n_layers, config.n_heads, config.d_ffn, config.vocab_size
    a = config.attention
    per_layer = (d + 2 * config.kv_heads * config.head_dim) * d  # W_Q, then W_K and W_V per key/value head
    per_layer += (config.head_dim if config.head_merge == "sum" else d) * d
    per_layer += (3 if config.ffn in ("swiglu", "geglu", "reglu") else 2) * d * f
    per_layer += d * (H if a.gate_granularity == "headwise" else d) if a.gated else 0
    per_layer += op_spec(a.op).matmul_weights(a, H, config.head_dim)
    return float(L * per_layer), float(d * V)


def admitted_pairs_count(config: ModelConfig, context_length: int) -> int:
    """(query, key) pairs one layer computes for one sequence under the config's mask, sink tokens and bias-slot
    columns included: closed forms of ``masks.admitted_pairs``."""
    n = context_length + config.sink_tokens
    pairs = n * (n + 1) // 2
    if config.mask == "sliding":
        w = config.window
        pairs = pairs if n <= w else w * (w + 1) // 2 + (n - w) * w
    elif config.mask == "prefix":
        p = min(n, config.sink_tokens + config.prefix_len)
        pairs += p * (p - 1) // 2
    return pairs + n * config.n_bias_slots


def flops_per_token(arch: ModelConfig, context_length: int, convention: Convention = "exact") -> float:
    """Training FLOPs per real token (forward + backward) for sequences of ``context_length`` tokens."""
    if context_length < 1:
        raise ValueError(f"context_length={context_length}: must be >= 1")
    n_blocks, n_head = matmul_params_per_token(arch)
    L, d, C = arch.n_layers, arch.d_model, context_length
    if convention == "palm":
        return 6.0 * (n_blocks + n_head) + 12.0 * L * d * C
    if convention != "exact":
        raise ValueError(f"convention={convention!r}: allowed 'exact' or 'palm'")
    per_sequence = 6.0 * (C + arch.sink_tokens) * n_blocks + 6.0 * C * n_head
    per_sequence += 12.0 * L * d * admitted_pairs_count(arch, C)
    return per_sequence / C


def device_peak_flops(name: str | None = None) -> float | None:
    """Dense bf16 peak FLOP/s of one device (``name`` default: this one), ``SINKLAB_PEAK_TFLOPS`` (TFLOP/s) first;
    None on CPU or an unknown device."""
    override = os.environ.get(PEAK_ENV, "").strip()
    if override:
        try:
            value = float(override)
        except ValueError:
            value = float("nan")
        if not value > 0 or value == float("inf"):
            raise ValueError(f"{PEAK_ENV}={override!r}: expected a positive number of TFLOP/s, e.g. 989")
        return value * 1e12
    if name is None:
        import torch

        if not torch.cuda.is_available():
            return None
        name = torch.cuda.get_device_name()
    return next((tflops * 1e12 for pattern, _, tflops in DEVICE_PEAK_TFLOPS if re.search(pattern, name, re.I)), None)


def mfu(tokens_per_s: float, flops_per_token: float, peak: float | None) -> float | None:
    """Achieved model FLOP/s over peak FLOP/s (per device: pass one device's tokens/s)."""
    if peak is None or peak <= 0:
        return None
    return tokens_per_s * flops_per_token / peak
