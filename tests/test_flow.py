"""Information-flow metrics (pipeline.flow) on hand-made cases and through the probe."""

import math

import pytest
import torch
from analysis_helpers import micro_model

from pipeline import flow
from pipeline.probe import run_probe

BOS = 1


def test_matrix_entropy_is_zero_for_rank_one_and_one_for_orthonormal_rows():
    u, v = torch.randn(16, 1), torch.randn(1, 32)
    assert flow.matrix_entropy(u @ v).item() == pytest.approx(0.0, abs=1e-6)
    rows = torch.linalg.qr(torch.randn(32, 16)).Q.T  # 16 orthonormal rows in R^32
    assert flow.matrix_entropy(rows).item() == pytest.approx(1.0, abs=1e-6)
    assert flow.matrix_entropy(3.0 * rows).item() == pytest.approx(1.0, abs=1e-6)  # scale-free
    batch = torch.stack([u @ v, rows])  # [2, 16, 32]
    assert flow.matrix_entropy(batch).shape == (2,)


def test_matrix_entropy_hand_computed():
    x = torch.zeros(4, 3)
    x[0, 0], x[1, 1] = 2.0, 1.0  # singular values 2 and 1: λ = (0.8, 0.2), normalised by log 3
    von_neumann = -(0.8 * math.log(0.8) + 0.2 * math.log(0.2)) / math.log(3)
    assert flow.matrix_entropy(x).item() == pytest.approx(von_neumann, rel=1e-6)
    with pytest.raises(ValueError, match="T, d >= 2"):
        flow.matrix_entropy(torch.zeros(1, 3))


def test_perturbation_spread_hand_computed():
    clean = torch.ones(1, 4, 2)
    moved = clean.clone()
    moved[0, 1] += 5.0  # the perturbed position itself does not count
    moved[0, 2, 0] += 0.3  # ‖Δ‖/‖h‖ = 0.3 / √2
    spread = flow.perturbation_spread(clean, moved, position=1, rho=0.1)
    assert spread.item() == pytest.approx((0.3 / math.sqrt(2) + 0.0) / 2 / 0.1, rel=1e-6)
    with pytest.raises(ValueError, match="no later token"):
        flow.perturbation_spread(clean, moved, position=3, rho=0.1)


def test_largest_step():
    assert flow.largest_step([1.0, 1.2, 9.0, 9.5], start=1.0, rise=True) == 2
    assert flow.largest_step([0.9, 0.3, 0.2], start=None, rise=False) == 1  # layer 0 has no predecessor
    assert flow.largest_step([0.9, 0.3, 0.2], start=1.0, rise=False) == 1
    assert flow.largest_step([0.5], start=None, rise=True) is None
    assert flow.largest_step([0.9, 0.8], start=1.0, rise=True) is None  # nothing rises


def bos_only_model(attend_to_bos: bool = True):
    """A micro SinkLab model (no positions) whose every head puts all attention on the BOS token:
    channel 0 is BOS's alone (10), channel 1 every other token's (1); queries read channel 1 and
    keys channel 0 at a gain that makes the BOS logit ~1000 above the rest, and no layer writes
    into channels 0 and 1. With ``attend_to_bos=False`` the query/key weights are zero: uniform."""
    model = micro_model(positional="nope")
    d, dh = model.config.d_model, model.config.head_dim
    with torch.no_grad():
        model.embed.weight[:, 0], model.embed.weight[:, 1] = 0.0, 1.0
        model.embed.weight[BOS] = 0.0
        model.embed.weight[BOS, 0] = 10.0
        for block in model.blocks:
            block.attn.qkv.weight[: 2 * d] = 0.0
            if attend_to_bos:
                for h in range(model.config.n_heads):
                    block.attn.qkv.weight[h * dh, 1] = 30.0  # query: channel 1
                    block.attn.qkv.weight[d + h * dh, 0] = 30.0  # key: channel 0
            block.attn.out.weight[:2] = 0.0
            block.ffn.down.weight[:2] = 0.0
    return model


def probe_tokens(n=6, T=12):
    g = torch.Generator().manual_seed(0)
    return torch.cat([torch.full((n, 1), BOS), torch.randint(2, 64, (n, T - 1), generator=g)], 1)


def test_heads_that_attend_only_to_bos_spread_a_perturbation_to_no_other_position():
    tokens = probe_tokens()
    sink = run_probe(bos_only_model(), tokens, outliers=False)
    assert sink.alpha1.min().item() > 0.999  # every head parks on BOS
    assert sink.flow.position == 6 and sink.flow.mixing.shape == (2,)
    assert sink.flow.mixing.abs().max().item() == 0.0
    uniform = run_probe(bos_only_model(attend_to_bos=False), tokens, outliers=False)
    assert (uniform.flow.mixing > 1e-3).all()  # the same model attending evenly mixes the perturbation in
    assert uniform.flow.mixing[1] > uniform.flow.mixing[0]  # and more of it with depth


def test_the_probe_reports_the_flow_metrics():
    model = micro_model()
    tokens = torch.randint(0, 64, (5, 16))
    measures = run_probe(model, tokens, batch_size=2)
    m = measures.to_metrics()
    assert {"flow/entropy_l0", "flow/entropy_l1", "flow/entropy_input", "flow/mixing_l1", "flow/mixing_last"} <= set(m)
    assert all(0.0 <= m[f"flow/entropy_l{l}"] <= 1.0 for l in range(2))
    assert m["flow/mixing_last"] > 0
    assert measures.to_json()["flow"]["mixing"] == pytest.approx(measures.flow.mixing.tolist())
    again = run_probe(model, tokens, batch_size=2)  # the perturbation directions are seeded
    torch.testing.assert_close(again.flow.mixing, measures.flow.mixing)
    assert run_probe(model, tokens, flow=False).flow is None
    assert not any(k.startswith("flow/") for k in run_probe(model, tokens, flow=False).to_metrics())


def test_the_perturbed_pass_leaves_the_other_metrics_alone():
    model = micro_model(sink_tokens=1)
    tokens = torch.randint(0, 64, (4, 16))
    with_flow, without = (
        run_probe(model, tokens, output_qkv=True),
        run_probe(model, tokens, output_qkv=True, flow=False),
    )
    assert with_flow.to_json() | {"flow": None} == without.to_json()
    assert with_flow.flow.entropy.shape == (2,) and with_flow.flow.mixing.shape == (2,)


def test_training_perturbs_only_the_first_sequences():
    """``mixing_sequences``: the over-mixing of the first k sequences exactly (the same batches,
    the same seeded directions), the entropies still of every sequence."""
    assert flow.probe_batches(5, 2, 3) == [(0, 2), (2, 3), (3, 5)]
    assert flow.probe_batches(5, 2) == [(0, 2), (2, 4), (4, 5)]
    model = micro_model()
    tokens = torch.randint(0, 64, (5, 16))
    part = run_probe(model, tokens, batch_size=2, outliers=False, mixing_sequences=3)
    first = run_probe(model, tokens[:3], batch_size=2, outliers=False)
    every = run_probe(model, tokens, batch_size=2, outliers=False)
    assert torch.equal(part.flow.mixing, first.flow.mixing)
    assert not torch.equal(part.flow.mixing, every.flow.mixing)
    torch.testing.assert_close(part.flow.entropy, every.flow.entropy)
    assert part.to_json() | {"flow": None} == every.to_json() | {"flow": None}
    straddled = flow.FlowAccumulator(mixing_sequences=3)
    straddled.perturbed_rows = 2
    with pytest.raises(ValueError, match="straddles mixing_sequences=3"):
        straddled.perturbs(2)
