"""FLOPs per token, device peaks and MFU (pipeline.flops) against hand counts."""
import pytest
import torch

from pipeline.flops import admitted_pairs_count, device_peak_flops, flops_per_token, matmul_params_per_token, mfu
from pipeline.model import ModelConfig, Transformer
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
    assert admitted_pairs_count(cfg, 8) == 1 + 2 + 3 * 6          # rows see 1, 2, 3, 3, ...
    cfg = micro(mask="prefix", prefix_len=3)
    assert admitted_pairs_count(cfg, 8) == 36 + 3                  # pairs (0,1) (0,2) (1,2)
    # one sink token: 9 slots through the blocks, 8 through the head, 45 pairs + 9 k* columns
    cfg = micro(sink_tokens=1, biases=dict(kind="kv"))
    assert admitted_pairs_count(cfg, 8) == 45 + 9
    expected = (6 * 9 * 20480 + 6 * 8 * 2048 + 12 * 2 * 32 * 54) / 8
    assert flops_per_token(cfg, 8) == expected


@pytest.mark.parametrize("overrides", [
    dict(), dict(mask="sliding", window=5), dict(mask="prefix", prefix_len=4, sink_tokens=2),
    dict(attention=dict(sink_logit=True), biases=dict(kind="k")), dict(mask="sliding", window=40),
])
def test_pair_count_agrees_with_the_models_mask(overrides):
    cfg = micro(**overrides)
    n = 20 + cfg.sink_tokens
    idx = torch.arange(n)
    assert admitted_pairs_count(cfg, 20) == int(admitted_pairs(cfg, idx, idx).sum()) + n * cfg.n_bias_slots


@pytest.mark.parametrize("overrides", [
    dict(), dict(ffn="gelu"), dict(head_merge="sum"), dict(attention=dict(gated=True)), dict(tie_embeddings=True),
])
def test_matmul_params_agree_with_the_model(overrides):
    """N_blocks + N_head = the model's matrices, less the input embedding (counted as the head
    when tied, since the head matmul runs either way)."""
    cfg = micro(**overrides)
    model = Transformer(cfg)
    matrices = sum(p.numel() for name, p in model.named_parameters() if p.ndim == 2 and name != "embed.weight")
    if cfg.tie_embeddings:
        matrices += cfg.vocab_size * cfg.d_model
    assert sum(matmul_params_per_token(cfg)) == matrices


def test_kernel_mlp_counts_each_use_per_head():
    base = micro(attention=dict(op="kernel", kernel="identity", normalizer="abs_clamp"))
    mlp = micro(attention=dict(op="kernel", kernel="mlp", normalizer="abs_clamp"))
    # d_h = 16: two 16x16 layers on q and k of 2 heads, per layer: 2 * 256 * 2 * 2 = 2048; x2 layers
    assert matmul_params_per_token(mlp)[0] - matmul_params_per_token(base)[0] == 4096


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
