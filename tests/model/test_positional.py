"""Appendix A formulas and the propositions of Appendix B.1 on repeated-token sequences."""

import math

import pytest
import torch

from pipeline.metrics import importance, sink_rate
from pipeline.model import ModelConfig, Transformer
from pipeline.model.positional import Sinusoidal, alibi_slopes, relative_bucket


def _model(**overrides):
    torch.manual_seed(0)
    # a larger init than training's so that the attention logits are far from uniform
    return Transformer(ModelConfig.from_preset("micro", init_std=0.3, **overrides)).eval()


def _repeated(T, token=7):
    return torch.full((1, T), token)


def test_sinusoidal_matches_eq5_by_hand():
    cfg = ModelConfig.from_preset("micro", positional="sinusoidal")
    p = Sinusoidal(cfg).input_embedding(torch.tensor([0, 3]))
    d = cfg.d_model
    t = 3
    expected = []
    for i in range(1, d // 2 + 1):
        w = 1 / 10000 ** (2 * (i - 1) / d)
        expected += [math.sin(w * t), math.cos(w * t)]
    assert torch.allclose(p[1], torch.tensor(expected), atol=1e-6)
    assert torch.equal(p[0][0::2], torch.zeros(d // 2)) and torch.equal(p[0][1::2], torch.ones(d // 2))


def test_alibi_slopes_eq7():
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0**-h for h in range(1, 9)]))
    assert torch.allclose(alibi_slopes(16), torch.tensor([2.0 ** (-h / 2) for h in range(1, 17)]))


def test_relative_buckets_eq6_by_hand():
    n = torch.tensor([0, 1, 15, 16, 32, 64, 127, 128, 1000])
    # n < 16: n; 16 <= n < 128: 16 + floor(log(n/16)/log(8) * 16); n >= 128: 31
    assert relative_bucket(n, 32, 128).tolist() == [0, 1, 15, 16, 21, 26, 31, 31, 31]


def test_prop1_nope_repeated_tokens_attend_uniformly():
    T = 12
    out = _model(positional="nope")(_repeated(T), output_attentions=True)
    expected = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]
    for attn in out.attentions:
        torch.testing.assert_close(attn[0], expected.expand_as(attn[0]), atol=1e-6, rtol=0)


def test_prop2_relative_pe_first_token_ties_with_all_far_tokens():
    T, D = 140, 128
    out = _model(positional="relative")(_repeated(T), output_attentions=True)
    for attn in out.attentions:
        for t in (D, T - 1):  # 0-based query index; distance t - j >= D for j <= t - D
            row = attn[0, :, t, : t + 1]
            far = row[:, : t - D + 1]
            torch.testing.assert_close(far, row[:, :1].expand_as(far), atol=1e-7, rtol=1e-5)
            assert torch.all(row[:, :1] >= row.max(dim=-1, keepdim=True).values * (1 - 1e-5))
            if t > D:  # several tokens share the largest score: no unique sink
                assert far.shape[-1] > 1


def test_relative_pe_taken_literally_is_a_sink_before_training():
    """Eq. 6's g(i - j) grows with distance and the first token is every row's farthest key, so
    with q.k = 0 the first token already holds alpha_1 > eps = 0.3 on the 64-token probe in every
    head (Sink_1 = 100% at step 0, as the cpu run measured: alpha_1 0.334)."""
    T = 64
    model = _model(positional="relative")
    for block in model.blocks:  # queries = 0: the scores are the relative bias alone
        torch.nn.init.zeros_(block.attn.qkv.weight[: model.config.d_model])
    out = model(torch.randint(0, model.config.vocab_size, (1, T)), output_attentions=True)
    alpha1 = torch.stack([importance(a, 1) for a in out.attentions])
    bias = relative_bucket(torch.arange(T)[:, None] - torch.arange(T)[None, :], 32, 128).float()
    closed_form = bias.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf")).softmax(-1)[:, 0].mean()
    torch.testing.assert_close(alpha1, closed_form.expand_as(alpha1), atol=1e-5, rtol=0)
    assert round(closed_form.item(), 3) == 0.334 and sink_rate(alpha1) == 100.0


def test_prop3_alibi_first_column_is_each_rows_smallest():
    T = 10
    out = _model(positional="alibi")(_repeated(T), output_attentions=True)
    for attn in out.attentions:
        for t in range(1, T):
            row = attn[0, :, t, : t + 1]
            assert torch.all(row[:, 0] < row[:, 1:].min(dim=-1).values)


def test_prop4_rope_scores_are_bounded():
    T = 24
    out = _model(positional="rope")(_repeated(T), output_attentions=True, output_qkv=True)
    for attn, q, k in zip(out.attentions, out.queries, out.keys):
        # xi = |q| |k| of the scaled dot product q k^T / sqrt(d_h) (rotation keeps norms)
        xi = q[0, :, 0].norm(dim=-1) * k[0, :, 0].norm(dim=-1) / math.sqrt(q.shape[-1])
        t = torch.arange(1, T + 1, dtype=torch.float32)
        bound = torch.exp(2 * xi)[:, None] / (torch.exp(2 * xi)[:, None] + t[None] - 1)  # [H, T]
        assert torch.all(attn[0].max(dim=-1).values <= bound + 1e-6)
        assert not torch.allclose(attn[0, :, -1, :T], torch.full((T,), 1 / T).expand(attn.shape[1], T))


@pytest.mark.parametrize("positional", ["nope", "rope", "relative", "t5", "alibi"])
def test_hidden_states_of_repeated_tokens_are_equal_across_positions(positional):
    out = _model(positional=positional)(_repeated(9), output_hidden_states=True)
    for h in out.hidden_states:
        torch.testing.assert_close(h[0], h[0, :1].expand_as(h[0]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_absolute_positions_break_the_equality(positional):
    out = _model(positional=positional)(_repeated(9), output_hidden_states=True)
    assert not torch.allclose(out.hidden_states[0][0, 0], out.hidden_states[0][0, 1], atol=1e-3)
