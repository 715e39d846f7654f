"""FLOPs per token, device peaks and MFU (pipeline.flops) against hand counts and against the
FLOPs torch counts in the model's forward, for every registered attention op."""

import dataclasses
from typing import get_args, get_type_hints

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from pipeline.flops import admitted_pairs_count, device_peak_flops, flops_per_token, matmul_params_per_token, mfu
from pipeline.model import ModelConfig, Transformer
from pipeline.model.attention_ops import OPS, register
from pipeline.model.config import AttentionConfig
from pipeline.model.masks import admitted_pairs


def micro(**overrides) -> ModelConfig:
    """The `micro` preset, the shape of the hand counts below."""
    return ModelConfig.from_preset("micro", **overrides)


def test_micro_config_hand_count():
    # per layer: W_QKV 3*32^2 = 3072, W_O 32^2 = 1024, SwiGLU 3*32*64 = 6144 -> 10240; x2 layers
    # head 32*64 = 2048; N = 22528, 6N = 135168
    cfg = micro()
    assert matmul_params_per_token(cfg) == (20480.0, 2048.0)
    # causal C = 8: 36 admitted pairs; 12 * L * d * 36 / 8 = 12 * 2 * 32 * 4.5 = 3456
    assert flops_per_token(cfg, 8) == 135168 + 3456
    # PaLM: full square, 12 * L * d * C = 12 * 2 * 32 * 8 = 6144
    assert flops_per_token(cfg, 8, convention="palm") == 135168 + 6144


def test_masks_sink_tokens_and_slots_hand_count():
    cfg = micro(mask="sliding", window=3)
    assert admitted_pairs_count(cfg, 8) == 1 + 2 + 3 * 6  # rows see 1, 2, 3, 3, ...
    cfg = micro(mask="prefix", prefix_len=3)
    assert admitted_pairs_count(cfg, 8) == 36 + 3  # pairs (0,1) (0,2) (1,2)
    # one sink token: 9 positions through the blocks, 8 through the head, 45 pairs + 9 k* columns
    cfg = micro(sink_tokens=1, biases=dict(kind="kv"))
    assert admitted_pairs_count(cfg, 8) == 45 + 9
    expected = (6 * 9 * 20480 + 6 * 8 * 2048 + 12 * 2 * 32 * 54) / 8
    assert flops_per_token(cfg, 8) == expected


@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(mask="sliding", window=5),
        dict(mask="prefix", prefix_len=4, sink_tokens=2),
        dict(attention=dict(sink_logit=True), biases=dict(kind="k")),
        dict(mask="sliding", window=40),
    ],
)
def test_pair_count_agrees_with_the_models_mask(overrides):
    cfg = micro(**overrides)
    n = 20 + cfg.sink_tokens
    idx = torch.arange(n)
    assert admitted_pairs_count(cfg, 20) == int(admitted_pairs(cfg, idx, idx).sum()) + n * cfg.n_bias_slots


@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(ffn="gelu"),
        dict(head_merge="sum"),
        dict(attention=dict(gated=True)),
        dict(attention=dict(gated=True, gate_granularity="elementwise")),
        dict(tie_embeddings=True),
        dict(n_kv_heads=1),
    ],
)
def test_matmul_params_agree_with_the_model(overrides):
    """N_blocks + N_head = the model's matrices, less the input embedding (counted as the head
    when tied, since the head matmul runs either way)."""
    cfg = micro(**overrides)
    model = Transformer(cfg)
    matrices = sum(p.numel() for name, p in model.named_parameters() if p.ndim == 2 and name != "embed.weight")
    if cfg.tie_embeddings:
        matrices += cfg.vocab_size * cfg.d_model
    assert sum(matmul_params_per_token(cfg)) == matrices


def test_elementwise_gate_counts_its_d_by_d_matmul():
    """The G1 gate's x W_g costs 2 d^2 FLOPs per token and layer forward, 6 d^2 forward + backward."""
    plain, g1 = micro(), micro(attention=dict(gated=True, gate_granularity="elementwise"))
    d, L = plain.d_model, plain.n_layers
    assert matmul_params_per_token(g1)[0] - matmul_params_per_token(plain)[0] == L * d * d
    assert flops_per_token(g1, 16) - flops_per_token(plain, 16) == pytest.approx(6 * L * d * d)
    _forward_flops_match(g1)  # and torch's count of the forward agrees


def test_kernel_mlp_counts_each_use_per_head():
    base = micro(attention=dict(op="kernel", feature_map="identity", normalizer="abs_clamp"))
    mlp = micro(attention=dict(op="kernel", feature_map="mlp", normalizer="abs_clamp"))
    # d_h = 16: two 16x16 layers on q and k of 2 heads, per layer: 2 * 256 * 2 * 2 = 2048; x2 layers
    assert matmul_params_per_token(mlp)[0] - matmul_params_per_token(base)[0] == 4096


def _every_op():
    """Each registered op with a normaliser it takes, under every feature map where it has one."""
    for name, spec in OPS.items():
        for feature_map in get_args(get_type_hints(AttentionConfig)["feature_map"]) if spec.phi else ("identity",):
            yield dict(op=name, normalizer=spec.normalizers[0], feature_map=feature_map)


def _forward_flops_match(cfg: ModelConfig, context: int = 8) -> None:
    """FLOPs of one forward as torch counts them on the eager path (the full T x T square, as
    the PaLM convention counts it; each bias-slot column 4 d per query and layer) against a
    third of flops_per_token's forward + backward."""
    model = Transformer(cfg)
    with FlopCounterMode(display=False) as counter:
        model(torch.randint(0, cfg.vocab_size, (1, context)), output_attentions=True)
    slots = 4 * cfg.n_layers * cfg.d_model * context * cfg.n_bias_slots
    assert counter.get_total_flops() == flops_per_token(cfg, context, convention="palm") * context / 3 + slots


@pytest.mark.parametrize("attention", list(_every_op()), ids=lambda a: f"{a['op']}-{a['feature_map']}")
def test_every_registered_op_counts_the_flops_its_forward_does(attention):
    _forward_flops_match(micro(attention=attention))


def test_an_op_registered_with_its_own_feature_map_is_counted():
    """A new op's phi (here a wider MLP than the kernel op's) counts without touching pipeline.flops."""

    class Wide(torch.nn.Module):
        def __init__(self, head_dim: int):
            super().__init__()
            self.up, self.down = (
                torch.nn.Linear(head_dim, 3 * head_dim, bias=False),
                torch.nn.Linear(3 * head_dim, head_dim, bias=False),
            )

        def forward(self, x):
            return self.down(F.relu(self.up(x)))

    register(dataclasses.replace(OPS["kernel"], name="test_wide_phi", phi=lambda a, head_dim: Wide(head_dim)))
    try:
        cfg = micro(attention=dict(op="test_wide_phi", normalizer="abs_clamp"))
        # d_h = 16: 2 * 16 * 48 weights on q and k of 2 heads, per layer; x2 layers
        assert matmul_params_per_token(cfg)[0] - matmul_params_per_token(micro())[0] == 2 * (2 * 16 * 48) * 2 * 2
        _forward_flops_match(cfg)
    finally:
        del OPS["test_wide_phi"]


def test_presets_are_in_the_expected_range():
    """60M preset: 6N term dominates at C = 2048 (the attention term is 12*L*d*C/2 per token)."""
    cfg = ModelConfig.from_preset("llama-60m")
    n_blocks, n_head = matmul_params_per_token(cfg)
    assert n_blocks == 10 * (4 * 768**2 + 3 * 768 * 1536)
    assert flops_per_token(cfg, 2048) == pytest.approx(6 * (n_blocks + n_head) + 6 * 10 * 768 * 2049)


def test_device_table_and_override(monkeypatch):
    monkeypatch.delenv("SINKLAB_PEAK_TFLOPS", raising=False)
    assert device_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert device_peak_flops("NVIDIA H100 PCIe") == 756e12
    assert device_peak_flops("NVIDIA H100 NVL") == 835e12
    assert device_peak_flops("NVIDIA H200") == 989e12
    assert device_peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert device_peak_flops("NVIDIA L4") == 121e12 and device_peak_flops("NVIDIA L40S") == 362e12
    assert device_peak_flops("NVIDIA GeForce GTX 1080") is None
    if not torch.cuda.is_available():
        assert device_peak_flops() is None
    monkeypatch.setenv("SINKLAB_PEAK_TFLOPS", "100")
    assert device_peak_flops("NVIDIA H100 PCIe") == 100e12
    monkeypatch.setenv("SINKLAB_PEAK_TFLOPS", "fast")
    with pytest.raises(ValueError, match="SINKLAB_PEAK_TFLOPS='fast'"):
        device_peak_flops()


def test_mfu():
    assert mfu(1000.0, 6e9, 989e12) == pytest.approx(6e12 / 989e12)
    assert mfu(1000.0, 6e9, None) is None
    with pytest.raises(ValueError, match="context_length"):
        flops_per_token(micro(), 0)
