"""Secondary-sink tracker on hand-made attention maps."""

from __future__ import annotations

import pytest
import torch

from pipeline.metrics import importance_profile
from pipeline.secondary_sinks import attention_share, layer_stats, secondary_sink_mask

# rows = queries, causal; key 2 draws 0.5, 0.6, 0.6 from queries 2..4
SECOND = torch.tensor(
    [
        [1.0, 0.0, 0.0, 0.0],
        [0.5, 0.5, 0.0, 0.0],
        [0.2, 0.6, 0.2, 0.0],
        [0.2, 0.6, 0.1, 0.1],
    ]
)


def test_importance_is_the_mean_over_the_queries_from_k_on():
    alpha = importance_profile(SECOND)
    assert alpha.tolist() == pytest.approx([1.9 / 4, 1.7 / 3, 0.3 / 2, 0.1])


def test_a_secondary_sink_at_a_known_position_is_found_with_its_share():
    attn = SECOND[None, None]  # [B=1, H=1, T, T]
    hidden = torch.zeros(1, 4, 3)
    hidden[0, :, 0] = torch.tensor([2.0, 4.0, 1.0, 1.0])  # norms 2, 4, 1, 1: mean 2
    stats = layer_stats(attn, eps=0.3, first=1, tokens=torch.tensor([[7, 8, 9, 10]]), hidden=hidden)
    assert secondary_sink_mask(attn, 0.3)[0, 0].tolist() == [False, True, False, False]
    assert stats.count == 1.0
    assert stats.share == pytest.approx(1.7 / 4)  # column 2's mass over the 4 rows' total
    assert stats.tokens == {8: 1}
    assert stats.norm_ratio == pytest.approx(2.0)
    assert attention_share(attn, 0.3).item() == pytest.approx(1.7 / 4)  # what the live probe logs


def test_first_positions_are_not_secondary():
    assert not secondary_sink_mask(SECOND, 0.3, first=2).any()
    assert secondary_sink_mask(SECOND, 0.3, first=0).tolist() == [True, True, False, False]


def test_a_uniform_causal_map_has_none():
    T = 16
    uniform = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]
    stats = layer_stats(uniform[None, None].expand(2, 3, T, T), eps=0.3, hidden=torch.randn(2, T, 8))
    assert stats.count == 0.0 and stats.share == 0.0 and stats.norm_ratio is None and not stats.tokens


def test_keys_with_too_few_queries_are_not_judged():
    self_attn = torch.eye(4) * 0.5
    self_attn[:, 0] += 0.5  # every row: half on key 1, half on itself
    self_attn[0, 0] = 1.0
    assert secondary_sink_mask(self_attn, 0.3).tolist() == [False, False, False, True]  # α_4 = 0.5, one query
    assert not secondary_sink_mask(self_attn, 0.3, min_queries=2).any()
