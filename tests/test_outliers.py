"""Activation outliers (pipeline.outliers) on hand-made tensors, and live in the sink probe."""

import math

import pytest
import torch
from analysis_helpers import MLP_FEATURE_MAP, greedy_windows, micro_model, planted_model

from pipeline.outliers import (
    OutlierAccumulator,
    capturing_block_outputs,
    capturing_linear_inputs,
    kurtosis,
    lower_median,
    max_abs,
    outlier_split,
)
from pipeline.probe import run_probe


def noise(B=3, T=16, d=32):
    return torch.randn(B, T, d, generator=torch.Generator().manual_seed(0))


def test_max_abs_and_kurtosis_by_hand():
    x = torch.tensor([[[1.0, -1.0], [1.0, -1.0]], [[0.0, 0.0], [0.0, -3.0]]])
    assert max_abs(x).tolist() == [1.0, 3.0]
    # ±1: m4 = m2² = 1; one spike among n = 4 values: (n² − 3n + 3) / (n − 1) = 7/3
    assert kurtosis(x).tolist() == pytest.approx([1.0, 7 / 3])
    assert kurtosis(torch.randn(1, 400, 500, generator=torch.Generator().manual_seed(1))).item() == pytest.approx(
        3.0, abs=0.05
    )


def test_a_planted_token_wise_outlier_is_found_at_its_position():
    x = noise()
    x[:, 0, :] += 100.0  # one position, all channels: the sink
    split = outlier_split(x)
    assert split.token_positions[:, 0].all() and not split.token_positions[:, 1:].any()
    assert not split.channels.any()


def test_a_planted_channel_wise_outlier_is_found_in_its_channel():
    x = noise()
    x[:, :, 5] += 100.0  # a few channels, all positions
    split = outlier_split(x)
    assert split.channels[:, 5].all() and split.channels.sum() == x.shape[0]
    assert not split.token_positions.any()


def test_both_kinds_together_and_a_massive_entry_in_one_channel():
    x = noise()
    x[:, :, 7] += 40.0  # channel-wise: above 20x the median at every position, below 100x
    x[1, 3, 11] = 500.0  # token-wise: one entry at one position (massive activations are a few channels)
    split = outlier_split(x)
    assert split.channels[:, 7].all() and split.channels.sum() == x.shape[0]
    assert split.token_positions.nonzero().tolist() == [[1, 3]]
    x[:, 2, 7] += 400.0  # far larger, but inside a channel-wise channel: still channel-wise
    assert outlier_split(x).token_positions.nonzero().tolist() == [[1, 3]]


def test_the_accumulator_averages_sequences_and_reads_linear_inputs():
    blocks = torch.nn.ModuleList(
        [torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)) for _ in range(2)]
    )
    x = noise(B=4)
    x[:2, 0, :] += 100.0  # half the sequences carry a token-wise outlier at position 1
    acc = OutlierAccumulator(lead=1)
    with torch.no_grad(), capturing_linear_inputs(blocks, acc), capturing_block_outputs(blocks) as hidden:
        h = x
        for block in blocks:
            h = block(h)
    acc.add_hidden([x, x])  # the residual stream, as a model hands it over: one tensor per layer
    assert len(hidden) == 2 and hidden[0].shape == x.shape
    measures = acc.measures()
    assert measures.lead_pct.tolist() == [50.0, 50.0] and measures.token_positions.tolist() == [0.5, 0.5]
    assert measures.max_abs[0].item() == pytest.approx(max_abs(x).mean().item())
    assert set(measures.linear_max) == {"0", "1"}  # names inside a block
    first = x.abs().amax(dim=(1, 2))
    rest = x[:, 1:].abs().amax(dim=(1, 2))
    assert measures.linear_max["0"][0].item() == pytest.approx(first.mean().item())
    assert measures.lead_scale_ratio["0"][0].item() == pytest.approx((first / rest).mean().item())
    metrics = measures.to_metrics()
    assert (
        metrics["act/tokenwise_lead_pct_l1"] == 50.0
        and metrics["act/linear_max_l0_0"] == measures.linear_max["0"][0].item()
    )
    assert metrics["act/max_abs"] == pytest.approx(max_abs(x).mean().item())


def test_the_probe_finds_the_planted_massive_activation():
    model = planted_model()
    tokens = greedy_windows(model, 6, 16)
    measures = run_probe(model, tokens, positions=4)
    out = measures.outliers
    down = out.linear_max["ffn.down"]
    assert down[0] > 900 and down[1] < 50  # layer 0's down projection reads the ~1000 at BOS
    assert out.lead_scale_ratio["ffn.down"][0] > 100
    assert out.summary()["linear_max_at"] == "l0.ffn.down"
    # the residual stream: BOS's channel 0 (100, against a median |h| of about 0.5) is a token-wise outlier
    assert out.lead_pct.tolist() == [100.0, 100.0]
    metrics = measures.to_metrics()  # what training logs at every sink probe
    assert metrics["act/linear_max_l0_ffn.down"] == pytest.approx(float(down[0]))
    assert {
        "act/kurtosis_pooled_l0",
        "act/max_abs_l1",
        "act/channelwise_channels_l0",
        "act/lead_scale_ratio_l1",
    } <= set(metrics)
    assert measures.to_json()["outliers"]["summary"]["lead_pct"] == 100.0
    assert run_probe(model, tokens, positions=4, outliers=False).outliers is None


def test_with_a_sink_token_the_lead_is_the_sink_token_and_the_first_token():
    model = micro_model(sink_tokens=1)
    measures = run_probe(model, torch.randint(3, 64, (4, 12), generator=torch.Generator().manual_seed(0)), positions=4)
    assert measures.outliers.lead == 2 and not math.isnan(measures.outliers.lead_scale_ratio["attn.qkv"][0])


def test_the_mlp_feature_map_s_per_head_linears_are_read_per_sequence_over_heads():
    model = micro_model(attention=MLP_FEATURE_MAP)
    tokens = torch.randint(3, 64, (4, 12), generator=torch.Generator().manual_seed(0))
    seen = []  # fc1's inputs in layer 0: phi(q), then phi(k), each [B, H, T, d_h]
    handle = model.blocks[0].attn.feature_map.fc1.register_forward_pre_hook(
        lambda _m, args: seen.append(args[0].detach())
    )
    try:
        measures = run_probe(model, tokens, positions=4)
    finally:
        handle.remove()
    assert seen and all(x.dim() == 4 for x in seen)
    whole = torch.cat([x.abs().amax(dim=(1, 2, 3)) for x in seen])
    rest = torch.cat([x[:, :, 1:].abs().amax(dim=(1, 2, 3)) for x in seen])
    out = measures.outliers
    assert out.linear_max["attn.feature_map.fc1"][0].item() == pytest.approx(whole.mean().item())
    assert out.lead_scale_ratio["attn.feature_map.fc1"][0].item() == pytest.approx((whole / rest).mean().item())
    assert "act/linear_max_l1_attn.feature_map.fc2" in measures.to_metrics()


def test_the_hf_path_reports_the_same_quantities(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    from pipeline.analysis.hf_capture import hf_sink_measures

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, attn_implementation="eager").eval()
    tokens = torch.randint(3, 200, (4, 12), generator=torch.Generator().manual_seed(0))
    out = hf_sink_measures(model, tokens, positions=4).outliers
    assert out.lead == 1 and out.max_abs.shape == (2,) and out.kurtosis_pooled.shape == (2,)
    assert {"self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"} <= set(out.linear_max)
    with torch.no_grad(), capturing_block_outputs(model.model.layers) as hidden:
        model(input_ids=tokens)
    assert out.max_abs.tolist() == pytest.approx([max_abs(h).mean().item() for h in hidden])


@pytest.mark.parametrize("n", [1, 2, 7, 8, 8192])
def test_lower_median_is_torch_median(n):
    rows = torch.randn(5, n, generator=torch.Generator().manual_seed(n)).abs()
    rows[0] = 1.0  # ties
    assert torch.equal(lower_median(rows), rows.median(dim=1).values)
