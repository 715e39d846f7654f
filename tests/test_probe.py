"""run_probe on a fake model whose attention maps are known in closed form."""

import json
import math

import pytest
import torch
from analysis_helpers import micro_model
from probe_cases import CASES, logged_values
from regen_probe_values import COMMAND, VALUES

from pipeline import metrics
from pipeline.model import ModelConfig, ModelOutput
from pipeline.probe import run_probe

T, L, H = 16, 2, 3


class FakeModel(torch.nn.Module):
    """Head (l, h) of sequence s puts all attention on the first real token when
    token0 + l*H + h is a multiple of 10, else each query attends to itself (alpha_1 = 1/T).
    With ``n_slots`` one K-bias column takes half of every real query's mass."""

    def __init__(self, n_slots=0, kind="probs"):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        # what run_probe reads of a SinkLab model: its config (mask, slots) and its blocks (none here)
        self.config = ModelConfig(preset="micro", biases={"kind": "k"} if n_slots else {})
        self.blocks = torch.nn.ModuleList()
        self.n_slots, self.kind, self.modes_seen = n_slots, kind, []

    def forward(self, idx, output_attentions=False, output_hidden_states=False, output_qkv=False, skip_head=False):
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
        return ModelOutput(
            logits=None,
            attentions=attns,
            attention_kind=self.kind,
            n_extra_queries=0,
            n_extra_keys=self.n_slots,
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
    measures = run_probe(model, tokens, eps=0.3, positions=4, batch_size=batch_size)
    assert measures.n_sequences == 100 and measures.seq_len == T
    assert measures.sink1 == pytest.approx(expected_sink1(range(100)))
    assert measures.profile[0] == measures.sink1 and measures.profile[1:] == [0.0, 0.0, 0.0]
    assert measures.alpha1.shape == (L, H)
    assert measures.massive_ratio.tolist() == pytest.approx([10.0, 10.0])
    assert not measures.is_proxy and measures.sink_star == {}
    assert model.training and all(mode == (False, False) for mode in model.modes_seen)
    m = measures.to_metrics()
    assert m["sink/sink1"] == measures.sink1 and m["sink/sink_k2"] == 0.0 and m["act/massive_ratio_l1"] == 10.0
    assert m["sink/alpha1_mean"] == pytest.approx(float(measures.alpha1.mean()))
    assert measures.alpha_profile[0] == pytest.approx(m["sink/alpha1_mean"]) and len(measures.alpha_profile) == 4
    # a self-attending head gives alpha_k = 1/(T-k+1); a sink head 0 for k >= 2
    expected = [(1 - measures.sink1 / 100) / (T - k + 1) for k in (2, 3, 4)]
    assert [m[f"sink/alpha{k}_mean"] for k in (2, 3, 4)] == pytest.approx(expected)
    assert "sink/alpha5_mean" not in m and "sink/alpha1_mean" in m


def test_run_probe_last_sequence_alone_is_counted():
    tokens = torch.ones(100, T, dtype=torch.long)
    tokens[99, 0] = 10  # only the last sequence has a sink, and only in head (0, 0)
    measures = run_probe(FakeModel(), tokens.numpy(), batch_size=25)
    assert measures.sink1 == pytest.approx(100.0 / (100 * L * H))


def test_run_probe_bias_slot_and_proxy():
    tokens = torch.zeros(20, T, dtype=torch.long)
    tokens[:, 0] = torch.arange(20)
    measures = run_probe(FakeModel(n_slots=1, kind="sim_nonneg"), tokens, eps=0.3, batch_size=8)
    assert measures.is_proxy
    assert measures.sink_star == {"0": 100.0}  # the slot gets 0.5 from every query
    # real part halves: a sink head now has alpha_1 = 0.5 > 0.3 and the rest 0.5/T
    assert measures.sink1 == pytest.approx(expected_sink1(range(20)))
    assert "sink/sink_star_0" in measures.to_metrics()
    rep_strict = run_probe(FakeModel(n_slots=1), tokens, eps=0.5)
    assert rep_strict.sink1 == 0.0 and rep_strict.sink_star == {"0": 0.0}


def test_run_probe_rejects_bad_tokens():
    with pytest.raises(ValueError, match=r"\[N, T\]"):
        run_probe(FakeModel(), torch.zeros(5, dtype=torch.long))


def _row_entropy_by_hand(attn, window=None):
    """Mean over rows i >= 2 of H_i / log n_i, n_i = the keys row i may see."""
    rows = []
    for i in range(1, attn.shape[-1]):
        n = i + 1 if window is None else min(i + 1, window)
        if n >= 2:
            p = attn[..., i, : i + 1]
            rows.append(torch.special.entr(p).sum(-1) / math.log(n))
    return torch.stack(rows, -1).mean(-1)


@pytest.mark.parametrize("overrides", [{}, {"mask": "sliding", "window": 4}])
def test_run_probe_head_entropy_and_output_norm(overrides):
    model = micro_model(**overrides)
    tokens = torch.randint(0, model.config.vocab_size, (3, 12), generator=torch.Generator().manual_seed(0))
    measures = run_probe(model, tokens, batch_size=2)
    with torch.no_grad():
        out = model(tokens, output_attentions=True, output_qkv=True)
    L_, H_ = len(out.attentions), model.config.n_heads
    assert measures.entropy.shape == measures.out_norm.shape == (L_, H_)
    for layer, (attn, values) in enumerate(zip(out.attentions, out.values)):
        by_hand = (attn @ values).norm(dim=-1).mean(dim=(0, -1))  # A·V per head, mean over tokens and sequences
        assert torch.allclose(measures.out_norm[layer], by_hand, atol=1e-5)
        entropy = _row_entropy_by_hand(attn, overrides.get("window")).mean(0)
        assert torch.allclose(measures.entropy[layer], entropy, atol=1e-5)
    logged = measures.head_metrics()
    assert logged["heads/entropy_l1_h0"] == pytest.approx(float(measures.entropy[1, 0]))
    assert logged["heads/out_norm_l0_h1"] == pytest.approx(float(measures.out_norm[0, 1]))
    assert logged["heads/dormant_pct"] == pytest.approx(
        100.0 * float(metrics.dormant_heads(measures.alpha1, measures.out_norm).double().mean())
    )
    assert measures.to_json()["entropy"] == measures.entropy.tolist()


def test_run_probe_without_head_outputs_reports_entropy_only():
    measures = run_probe(FakeModel(), torch.zeros(4, T, dtype=torch.long))
    assert measures.out_norm is None and measures.dormant_pct is None
    assert measures.entropy.abs().max() == 0.0  # every row of the fake maps is one-hot
    assert "heads/dormant_pct" not in measures.head_metrics() and "heads/entropy_l0_h0" in measures.head_metrics()


class ActiveDormantModel(torch.nn.Module):
    """One layer, one head as Guo et al.'s BB model ends up: a query holding token 7 (a trigger)
    attends to the previous token, every other query to token 1; value 1 has norm 1, the others 4."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.config, self.blocks = ModelConfig(preset="micro"), torch.nn.ModuleList()

    def forward(self, idx, output_attentions=False, output_hidden_states=False, output_qkv=False, skip_head=False):
        B, T_ = idx.shape
        a = torch.zeros(B, 1, T_, T_)
        a[:, 0, :, 0] = 1.0
        for b, i in (idx == 7).nonzero().tolist():
            a[b, 0, i] = 0.0
            a[b, 0, i, i - 1] = 1.0
        values = torch.full((B, 1, T_, 2), 2.0 * math.sqrt(2.0))  # norm 4
        values[:, :, 0] = 1.0 / math.sqrt(2.0)  # norm 1
        qkv = {"queries": [values], "keys": [values], "values": [values]} if output_qkv else {}
        return ModelOutput(
            logits=None,
            attentions=[a],
            attention_kind="probs",
            n_extra_queries=0,
            n_extra_keys=0,
            hidden_states=[torch.ones(B, T_, 4)],
            **qkv,
        )


def test_run_probe_splits_bos_attention_by_trigger_queries():
    tokens = torch.zeros(10, T, dtype=torch.long)
    tokens[::2, 5] = 7  # a trigger at position 6 in every other sequence
    measures = run_probe(ActiveDormantModel(), tokens, trigger_ids=[7, 9], batch_size=3, output_qkv=True)
    assert measures.bos_share_trigger.tolist() == [[0.0]]  # sequences without a trigger do not count
    assert measures.bos_share_other.tolist() == [[1.0]]
    m = measures.to_metrics()
    assert m["sink/bos_share_trigger_l0"] == 0.0 and m["sink/bos_share_other_l0"] == 1.0
    assert m["act/value_norm_ratio_l0"] == pytest.approx(0.25)  # the value-state drain
    plain = run_probe(ActiveDormantModel(), tokens)
    assert plain.bos_share_trigger is None and plain.value_norm_ratio is None
    assert not any(k.startswith(("sink/bos_share", "act/value_norm")) for k in plain.to_metrics())


@pytest.mark.parametrize("overrides", [{}, {"mask": "sliding", "window": 3}, {"sink_tokens": 1}])
def test_run_probe_max_logit_is_the_largest_admitted_qk_over_sqrt_dh(overrides):
    """Per layer and head, the largest q·k/√d_h over every sequence and admitted token pair,
    brute force from the model's own rotated queries and keys."""
    model = micro_model(**overrides)
    tokens = torch.randint(0, model.config.vocab_size, (3, 12), generator=torch.Generator().manual_seed(1))
    measures = run_probe(model, tokens, batch_size=2)
    with torch.no_grad():
        out = model(tokens, output_qkv=True)
    window = overrides.get("window", 12)
    dh = model.config.head_dim
    for layer, (q, k) in enumerate(zip(out.queries, out.keys)):
        for h in range(model.config.n_heads):
            brute = max(
                float(q[b, h, i] @ k[b, h, j]) / math.sqrt(dh)
                for b in range(3)
                for i in range(12)
                for j in range(max(0, i - window + 1), i + 1)
            )
            assert measures.max_logit[layer, h].item() == pytest.approx(brute, abs=1e-5)
    logged = measures.to_metrics()
    assert logged["attn/max_logit_l1"] == pytest.approx(float(measures.max_logit[1].max()))
    assert logged["attn/max_logit"] == max(logged[f"attn/max_logit_l{l}"] for l in range(measures.max_logit.shape[0]))
    assert measures.head_metrics()["heads/max_logit_l0_h1"] == pytest.approx(float(measures.max_logit[0, 1]))
    assert measures.to_json()["max_logit"] == measures.max_logit.tolist()


@pytest.mark.parametrize("case", sorted(CASES))
def test_run_probe_logs_the_recorded_values(case):
    """Every value a training probe logs, on a fixed seed, as recorded in tests/probe_values.json:
    a faster probe must measure the same things."""
    recorded = json.loads(VALUES.read_text())[case]
    measured = logged_values(case)
    regen = f"; if that is meant, `{COMMAND}` records the new values"
    assert sorted(measured) == sorted(recorded), f"the probe logs other names than {VALUES.name} holds{regen}"
    for name, value in recorded.items():
        assert measured[name] == pytest.approx(value, rel=1e-5, abs=1e-7, nan_ok=True), name + regen
