"""Sink and activation metrics against hand-computed values."""

import math

import pytest
import torch

from pipeline import metrics

A3 = torch.tensor([[1.0, 0.0, 0.0], [0.6, 0.4, 0.0], [0.5, 0.2, 0.3]])


def test_importance_hand_computed():
    assert metrics.importance(A3, 1).item() == pytest.approx((1 + 0.6 + 0.5) / 3)
    assert metrics.importance(A3, 2).item() == pytest.approx((0.4 + 0.2) / 2)
    assert metrics.importance(A3, 3).item() == pytest.approx(0.3)
    prof = metrics.importance_profile(A3.expand(2, 4, 3, 3), positions=10)
    assert prof.shape == (2, 4, 3)  # clipped to T
    assert prof[1, 3].tolist() == pytest.approx([0.7, 0.3, 0.3])


def test_importance_rejects_bad_input():
    with pytest.raises(ValueError, match="outside"):
        metrics.importance(A3, 0)
    with pytest.raises(ValueError, match="square"):
        metrics.importance(torch.zeros(2, 3), 1)


def test_sink_rate_strict_threshold_and_counting():
    # alpha_2 == 0.3 exactly is not a sink (strict >)
    alpha = metrics.importance_profile(A3, 3)
    assert metrics.sink_rate(alpha, 0.3) == pytest.approx(100 / 3)
    # 100 sequences x 4 layers x 5 heads; exactly 37 triples above eps, 5 of them in the last sequence
    a = torch.full((100, 4, 5), 0.1)
    a.view(-1)[torch.arange(32) * 7] = 0.9
    a[99, 0, :5] = 0.31
    assert int((a > 0.3).sum()) == 37
    assert metrics.sink_rate(a, 0.3) == pytest.approx(100 * 37 / 2000)
    assert metrics.sink_rate(a, 0.5) == pytest.approx(100 * 32 / 2000)


def test_split_extra_and_extra_importance():
    # 1 sink token (an extra query and key) + 1 K-bias slot, then 2 real tokens: map is [3 queries, 4 keys]
    attn = torch.tensor(
        [
            [0.7, 0.3, 0.0, 0.0],  # the sink token's own row: dropped
            [0.5, 0.2, 0.3, 0.0],  # real query 1
            [0.1, 0.3, 0.4, 0.2],  # real query 2
        ]
    )
    extra_mass, real = metrics.split_extra(attn, n_extra_queries=1, n_extra_keys=2)
    assert torch.allclose(real, torch.tensor([[0.3, 0.0], [0.4, 0.2]]))
    star = metrics.extra_importance(extra_mass)
    assert star.tolist() == pytest.approx([(0.5 + 0.1) / 2, (0.2 + 0.3) / 2])
    # Sink_1 refers to the first real token: alpha_1 = (0.3 + 0.4) / 2
    assert metrics.importance(real, 1).item() == pytest.approx(0.35)
    with pytest.raises(ValueError, match="not square"):
        metrics.split_extra(attn, 1, 1)


def test_proxy_scores():
    nonneg = torch.tensor([[2.0, 0.0], [1.0, 3.0]])
    assert metrics.proxy_scores(nonneg, signed=False).tolist() == [[1.0, 0.0], [0.25, 0.75]]
    signed = torch.tensor([[-1.0, 0.0], [1.0, -3.0]])
    assert metrics.proxy_scores(signed, signed=True).tolist() == [[1.0, 0.0], [0.25, 0.75]]
    with pytest.raises(ValueError, match="negative"):
        metrics.proxy_scores(signed, signed=False)
    masked = torch.tensor([[1.0, float("-inf")], [0.0, 0.0]])
    assert metrics.proxy_scores(masked, signed=True).tolist() == [[1.0, 0.0], [0.0, 0.0]]


def test_first_token_norm_ratio_of_hidden_states_and_keys():
    hidden = torch.tensor([[[3.0, 4.0], [1.0, 0.0], [0.0, 2.0]], [[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]])
    assert metrics.first_token_norm_ratio(hidden).tolist() == pytest.approx([5 / 1.5, 1.0])
    keys = hidden.unsqueeze(1).expand(2, 3, 3, 2)  # [B, H, T, dh]
    assert metrics.first_token_norm_ratio(keys).shape == (2, 3)


def test_qk_decomposition():
    q = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    k = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    cos, normprod = metrics.qk_decomposition(q, k)
    assert cos[1, 0].item() == pytest.approx(1 / math.sqrt(2))
    assert normprod[1, 0].item() == pytest.approx(2 * math.sqrt(2))
    assert cos[1, 1].item() == pytest.approx(1.0)
    assert math.isnan(cos[0, 1].item()) and math.isnan(normprod[0, 1].item())
    # cos * normprod reproduces the dot products on the causal part
    assert (cos * normprod)[1].tolist() == pytest.approx((q @ k.T)[1].tolist())
    first, rest = metrics.first_key_vs_rest(cos)
    assert first == pytest.approx(1 / math.sqrt(2)) and rest == pytest.approx(1.0)


def test_uniform_alpha1_is_the_harmonic_mean_over_queries():
    def causal(T: int) -> torch.Tensor:
        return torch.ones(T, T, dtype=torch.bool).tril()

    assert metrics.uniform_alpha1_masked(causal(1)) == 1.0
    assert metrics.uniform_alpha1_masked(causal(2)) == pytest.approx(0.75)
    assert metrics.uniform_alpha1_masked(causal(4)) == pytest.approx(25 / 48)
    assert metrics.uniform_alpha1_masked(causal(64)) == pytest.approx(0.074123, abs=1e-6)  # docs/training.md's 0.074
    with pytest.raises(ValueError):  # a query that admits no key
        metrics.uniform_alpha1_masked(torch.zeros(2, 2, dtype=torch.bool))


def test_uniform_alpha1_under_masks_and_slots():
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    assert metrics.uniform_alpha1_masked(causal) == pytest.approx(25 / 48)
    # one bias column every query sees: query i spreads over i + 1 keys
    with_bias = torch.cat([torch.ones(4, 1, dtype=torch.bool), causal], dim=1)
    assert metrics.uniform_alpha1_masked(with_bias, 0, 1) == pytest.approx((1 / 2 + 1 / 3 + 1 / 4 + 1 / 5) / 4)
    # sliding window of 2: only queries 1 and 2 see token 1
    window = causal & (torch.arange(4)[:, None] - torch.arange(4)[None, :] < 2)
    assert metrics.uniform_alpha1_masked(window) == pytest.approx((1 + 1 / 2) / 4)
    with pytest.raises(ValueError):
        metrics.uniform_alpha1_masked(torch.zeros(2, 2, dtype=torch.bool))


def test_emergence_steps_first_strict_crossing():
    u = 0.074
    history = [
        (500, 5.0, 0.1),
        (0, 0.0, 0.074),
        (100, 0.5, 0.08),
        (200, 1.0, 0.09),
        (300, 1.5, 0.0926),
        (400, 12.0, 0.2),
        (250, float("nan"), float("nan")),
    ]
    assert metrics.emergence_steps(history, u) == {"sink1_1pct": 300, "sink1_10pct": 400, "alpha1_125pct": 300}
    flat = [(0, 0.0, 0.074), (100, 1.0, 0.0925)]  # equal to a threshold is not above it
    assert metrics.emergence_steps(flat, u) == {"sink1_1pct": None, "sink1_10pct": None, "alpha1_125pct": None}
    assert metrics.emergence_steps([], u) == {"sink1_1pct": None, "sink1_10pct": None, "alpha1_125pct": None}
    assert metrics.first_step_above([(3, 2.0), (1, 0.5), (2, 2.5)], 1.0) == 2


def test_average_ranks_share_ties():
    assert metrics.average_ranks([10, 20, 20, 30]) == [1, 2.5, 2.5, 4]
    assert metrics.average_ranks([3, 1, 2]) == [3, 1, 2]
    assert metrics.average_ranks([5, 5, 5]) == [2, 2, 2]
    assert metrics.average_ranks([]) == []


def test_spearman_and_kendall_hand_computed():
    # one adjacent swap among 4: rho = 1 - 6*2/(4*15) = 0.8; tau = (5 - 1)/6
    assert metrics.spearman_rho([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert metrics.kendall_tau_b([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(2 / 3)
    # a tie in x: ranks [1, 2.5, 2.5, 4] -> rho = 4.5 / sqrt(4.5 * 5); tau-b = 5 / sqrt(5 * 6)
    assert metrics.spearman_rho([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(math.sqrt(0.9))
    assert metrics.kendall_tau_b([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(5 / math.sqrt(30))
    assert metrics.spearman_rho([1, 2, 3], [9, 5, 1]) == pytest.approx(-1.0)
    assert metrics.kendall_tau_b([1, 2, 3], [9, 5, 1]) == pytest.approx(-1.0)
    # unknown values drop their pair: two pairs left, in opposite order
    assert metrics.spearman_rho([1, None, 3, float("nan")], [2, 5, 1, 7]) == pytest.approx(-1.0)


@pytest.mark.parametrize(
    "x, y", [([], []), ([1.0], [2.0]), ([1, None], [2, 3]), ([0, 0, 0], [1, 2, 3]), ([1, 2, 3], [4, 4, 4])]
)
def test_rank_agreement_undefined_is_none(x, y):
    assert metrics.spearman_rho(x, y) is None
    assert metrics.kendall_tau_b(x, y) is None


def test_rank_agreement_matches_scipy_with_ties():
    stats = pytest.importorskip("scipy.stats")
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        x = torch.randint(0, 4, (9,), generator=gen).tolist()
        y = torch.randint(0, 5, (9,), generator=gen).tolist()
        if len(set(x)) < 2 or len(set(y)) < 2:
            continue
        assert metrics.spearman_rho(x, y) == pytest.approx(stats.spearmanr(x, y).statistic)
        assert metrics.kendall_tau_b(x, y) == pytest.approx(stats.kendalltau(x, y).statistic)


def test_attention_entropy_hand_computed():
    # query 1 sees one key (skipped); query 2 splits evenly over 2 keys (1); query 3 puts all on key 1 (0)
    a = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [1.0, 0, 0]])
    assert metrics.attention_entropy(a).item() == pytest.approx(0.5)
    # a row over 3 keys with (0.5, 0.25, 0.25): H = 1.5 ln 2, normalised by ln 3
    a[2] = torch.tensor([0.5, 0.25, 0.25])
    expected = (1.0 + 1.5 * math.log(2) / math.log(3)) / 2
    assert metrics.attention_entropy(a).item() == pytest.approx(expected)
    # proxy rows that do not sum to 1 are scaled first; an empty row is skipped
    assert metrics.attention_entropy(torch.tensor([[2.0, 0], [3.0, 3.0]])).item() == pytest.approx(1.0)
    assert metrics.attention_entropy(torch.tensor([[1.0, 0], [0.0, 0.0]])).isnan()


def test_attention_entropy_slots_and_masks():
    # one bias column seen by all: query 1 sees 2 keys and counts; uniform rows give 1 everywhere
    a = torch.tensor([[0.5, 0.5, 0, 0], [1 / 3, 1 / 3, 1 / 3, 0], [0.25, 0.25, 0.25, 0.25]])
    assert metrics.attention_entropy(a).item() == pytest.approx(1.0)
    # a window of 2 keys: uniform over the 2 admitted keys is entropy 1 (causal counting would say less)
    window = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 1, 1]], dtype=torch.bool)
    a = window.float() / window.sum(-1, keepdim=True)
    assert metrics.attention_entropy(a, window).item() == pytest.approx(1.0)
    assert metrics.attention_entropy(a).item() < 0.9
    with pytest.raises(ValueError, match="admitted"):
        metrics.attention_entropy(a, window[:2])


def test_head_output_norm_and_dormant_heads():
    out = torch.zeros(2, 3, 4)  # [H, T, dh]
    out[0, :, 0] = torch.tensor([3.0, 4.0, 5.0])
    out[1, :, :2] = torch.tensor([3.0, 4.0])  # norm 5 at every token
    assert metrics.head_output_norm(out).tolist() == pytest.approx([4.0, 5.0])
    alpha1 = torch.tensor([[0.9, 0.9, 0.1], [0.2, 0.8, 0.8]])
    norms = torch.tensor([[0.1, 1.0, 1.0], [1.0, 0.2, 2.0]])
    # layer 0 mean 0.7: head 0 (0.14 of it) parks; layer 1 mean 1.067: head 1 (0.19) parks, head 2 is broad
    assert metrics.dormant_heads(alpha1, norms).tolist() == [[True, False, False], [False, True, False]]
    assert not metrics.dormant_heads(alpha1, norms, eps=0.95).any()
    with pytest.raises(ValueError, match="must both be"):
        metrics.dormant_heads(alpha1, norms[0])


def test_first_key_share_splits_queries_and_skips_the_first():
    attn = torch.zeros(2, 1, 4, 4)  # [B, H, T, T]: A[i, 1] = 0.1 * (i + 1) in sequence 0, 1.0 in sequence 1
    attn[0, 0, :, 0] = torch.tensor([1.0, 0.2, 0.3, 0.4])
    attn[1, 0, :, 0] = 1.0
    chosen = torch.tensor([[True, True, False, True], [True, False, False, False]])
    share = metrics.first_key_share(attn, chosen)
    assert share[0, 0].item() == pytest.approx((0.2 + 0.4) / 2)  # query 1 never counts
    assert math.isnan(share[1, 0].item())  # only query 1 chosen: nothing to average
    rest = metrics.first_key_share(attn, ~chosen)
    assert rest[:, 0].tolist() == pytest.approx([0.3, 1.0])


def test_max_attention_logit_on_a_hand_made_case():
    """d_h = 4, T = 3, one head: the largest q·k lies above the diagonal (a future key), which the
    causal mask must drop; the admitted pairs' largest is q_3·k_2 = 6, over √4: 3."""
    q = torch.tensor([[1.0, 0, 0, 0], [0, 1, 0, 0], [0, 3, 0, 0]])[None, None]
    k = torch.tensor([[0.0, 0, 0, 0], [0, 2, 0, 0], [50, 0, 0, 0]])[None, None]
    # q_i·k_j: row 1 [0, 0, 50], row 2 [0, 2, 0], row 3 [0, 6, 0]
    assert metrics.max_attention_logit(q, k).tolist() == [[3.0]]
    everything = torch.ones(3, 3, dtype=torch.bool)
    assert metrics.max_attention_logit(q, k, everything).tolist() == [[25.0]]
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, 5, 8, generator=gen), torch.randn(2, 3, 5, 8, generator=gen)
    brute = torch.full((2, 3), -math.inf)
    for b in range(2):
        for h in range(3):
            for i in range(5):
                for j in range(i + 1):
                    brute[b, h] = max(brute[b, h], float(q[b, h, i] @ k[b, h, j]) / math.sqrt(8))
    assert torch.allclose(metrics.max_attention_logit(q, k), brute, atol=1e-6)


def test_a_validation_loss_that_turns_upward_is_called_memorising():
    from pipeline.metrics import memorising

    issue_27 = [(250, 3.4), (500, 2.95), (750, 2.81), (1000, 3.3), (1500, 4.4), (2000, 5.07)]  # gpu-small, embedded
    assert memorising(issue_27) == (
        "valid loss rising since step 750 (min 2.810 at 750, 5.070 at 2000): the model "
        "memorises its data; more data or fewer steps"
    )
    assert memorising([(0, 5.0), (250, 4.0), (500, 3.5)]) is None  # still falling
    assert memorising([(0, 5.0), (250, 4.0), (500, 4.05), (750, 4.06)]) is None  # flat within 3%
    assert memorising([(0, 5.0), (250, 4.0), (500, 4.5)]) is None  # one point after the minimum
    assert memorising([(0, 4.0), (250, float("nan")), (500, 4.5), (750, 4.6)]) is not None
