"""run_probe on a fake model whose attention maps are known in closed form."""
from types import SimpleNamespace

import pytest
import torch

from pipeline.analysis.probe import run_probe

T, L, H = 16, 2, 3


class FakeModel(torch.nn.Module):
    """Head (l, h) of sequence s puts all attention on the first real token when
    token0 + l*H + h is a multiple of 10, else each query attends to itself (alpha_1 = 1/T).
    With ``n_slots`` one K-bias column takes half of every real query's mass."""

    def __init__(self, n_slots=0, kind="probs"):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.n_slots, self.kind, self.modes_seen = n_slots, kind, []

    def forward(self, idx, output_attentions=False, output_hidden_states=False, output_qkv=False):
        self.modes_seen.append((self.training, torch.is_grad_enabled()))
        B = idx.shape[0]
        attns = []
        for l in range(L):
            a = torch.zeros(B, H, T, self.n_slots + T)
            eye = torch.eye(T)
            first = torch.zeros(T, T)
            first[:, 0] = 1.0
            for b in range(B):
                for h in range(H):
                    sink = (int(idx[b, 0]) + l * H + h) % 10 == 0
                    real = first if sink else eye
                    if self.n_slots:
                        a[b, h, :, 0] = 0.5
                        a[b, h, :, 1:] = 0.5 * real
                    else:
                        a[b, h] = real
            if self.kind == "sim_nonneg":
                a = a * 7.0  # unnormalised similarities; proxies recover the map
            attns.append(a)
        hidden = torch.ones(B, T, 4)
        hidden[:, 0] *= 10.0  # first token: norm 20 vs 2 -> ratio 10
        return SimpleNamespace(
            attentions=attns, attention_kind=self.kind, n_query_slots=0, n_key_slots=self.n_slots,
            hidden_states=[hidden] * L,
        )


def expected_sink1(first_tokens):
    hits = sum((t + l * H + h) % 10 == 0 for t in first_tokens for l in range(L) for h in range(H))
    return 100.0 * hits / (len(first_tokens) * L * H)


@pytest.mark.parametrize("batch_size", [25, 30, 100])
def test_run_probe_counts_every_sequence(batch_size):
    tokens = torch.zeros(100, T, dtype=torch.long)
    tokens[:, 0] = torch.arange(100)
    model = FakeModel()
    model.train()
    rep = run_probe(model, tokens, eps=0.3, positions=4, batch_size=batch_size)
    assert rep.n_sequences == 100 and rep.seq_len == T
    assert rep.sink1 == pytest.approx(expected_sink1(range(100)))
    assert rep.profile[0] == rep.sink1 and rep.profile[1:] == [0.0, 0.0, 0.0]
    assert rep.alpha1.shape == (L, H)
    assert rep.massive_ratio.tolist() == pytest.approx([10.0, 10.0])
    assert not rep.is_proxy and rep.sink_star == {}
    assert model.training and all(mode == (False, False) for mode in model.modes_seen)
    m = rep.to_metrics()
    assert m["sink/sink1"] == rep.sink1 and m["sink/sink_k2"] == 0.0 and m["act/massive_ratio_l1"] == 10.0
    assert m["sink/alpha1_mean"] == pytest.approx(float(rep.alpha1.mean()))


def test_run_probe_last_sequence_alone_is_counted():
    tokens = torch.ones(100, T, dtype=torch.long)
    tokens[99, 0] = 10  # only the last sequence has a sink, and only in head (0, 0)
    rep = run_probe(FakeModel(), tokens.numpy(), batch_size=25)
    assert rep.sink1 == pytest.approx(100.0 / (100 * L * H))


def test_run_probe_bias_slot_and_proxy():
    tokens = torch.zeros(20, T, dtype=torch.long)
    tokens[:, 0] = torch.arange(20)
    rep = run_probe(FakeModel(n_slots=1, kind="sim_nonneg"), tokens, eps=0.3, batch_size=8)
    assert rep.is_proxy
    assert rep.sink_star == {"0": 100.0}  # the slot gets 0.5 from every query
    # real part halves: a sink head now has alpha_1 = 0.5 > 0.3 and the rest 0.5/T
    assert rep.sink1 == pytest.approx(expected_sink1(range(20)))
    assert "sink/sink_star_0" in rep.to_metrics()
    rep_strict = run_probe(FakeModel(n_slots=1), tokens, eps=0.5)
    assert rep_strict.sink1 == 0.0 and rep_strict.sink_star == {"0": 0.0}


def test_run_probe_rejects_bad_tokens():
    with pytest.raises(ValueError, match=r"\[N, T\]"):
        run_probe(FakeModel(), torch.zeros(5, dtype=torch.long))
