"""The states a forward returns for the probe, block by block."""

import pytest
import torch

from pipeline import metrics
from pipeline.model import ModelConfig, Transformer
from pipeline.probe import run_probe


def _ffn_sums(model: Transformer, idx: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """x + FFN(x) of every block, by hand from each FFN's input and output, and the logits."""
    seen = []
    handles = [b.ffn.register_forward_hook(lambda m, i, o: seen.append(i[0] + o)) for b in model.blocks]
    out = model(idx, output_hidden_states=True)
    for h in handles:
        h.remove()
    return seen, out


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_post_norm_records_the_residual_sum_before_the_blocks_last_norm(norm):
    """Gu et al. 2025, Fig. 7 left: post-norm's massive activations are in x + FFN(x), before the LN."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("micro", norm_position="post", norm=norm, init_std=0.2)).eval()
    idx = torch.randint(0, 64, (3, 12))
    with torch.no_grad():
        sums, out = _ffn_sums(model, idx)
        for block, recorded, expected in zip(model.blocks, out.hidden_states, sums, strict=True):
            torch.testing.assert_close(recorded, expected)
            assert not torch.allclose(recorded, block.ffn_norm(expected), atol=1e-3)
        torch.testing.assert_close(out.logits, model.lm_head(model.blocks[-1].ffn_norm(sums[-1])))
        measures = run_probe(model, idx, outliers=False, flow=False)
    ratios = torch.stack([metrics.first_token_norm_ratio(h).mean() for h in sums])
    torch.testing.assert_close(measures.massive_ratio, ratios)


def test_pre_norm_records_each_blocks_output():
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("micro", init_std=0.2)).eval()
    outputs = []
    for block in model.blocks:
        block.register_forward_hook(lambda m, i, o: outputs.append(o[0]))
    with torch.no_grad():
        out = model(torch.randint(0, 64, (2, 10)), output_hidden_states=True)
    for recorded, expected in zip(out.hidden_states, outputs, strict=True):
        assert recorded is expected
    torch.testing.assert_close(out.logits, model.lm_head(model.norm(outputs[-1])))
