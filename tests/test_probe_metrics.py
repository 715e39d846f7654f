"""The probe's registered metrics: values against the pure functions layer by layer, Kaul et al.'s
kurtosis by hand, and the registry as the one list the names are read from."""

import pytest
import torch

from pipeline import metric_names as N
from pipeline import metrics, outliers, probe_metrics, secondary_sinks
from pipeline.flow import TRAINING_MIXING_SEQUENCES, matrix_entropy
from pipeline.model import ModelConfig, Transformer
from pipeline.model.masks import admitted_with_slots
from pipeline.probe import SinkAccumulator, run_probe
from pipeline.probe_metrics import ProbeBatch


def _model(**overrides):
    torch.manual_seed(0)
    return Transformer(ModelConfig.from_preset("micro", init_std=0.1, **overrides)).eval()


def _tokens(n=30, T=24):
    tokens = torch.randint(0, 64, (n, T), generator=torch.Generator().manual_seed(1))
    tokens[:, 0] = 1
    return tokens


def _by_layer(model, tokens, triggers):
    """What the probe logs, one layer at a time from one plain forward (logits included) and the
    pure functions: the reference the stacked, registered computation must equal."""
    with torch.no_grad():
        out = model(tokens, output_attentions=True, output_hidden_states=True, output_qkv=True)
    nq, nk, T = out.n_query_slots, out.n_key_slots, tokens.shape[1]
    admitted = admitted_with_slots(model.config, T)
    expect, alphas = {}, []
    for l, a in enumerate(out.attentions):
        a = a.float()
        if out.attention_kind != "probs":
            a = metrics.proxy_scores(a, signed=out.attention_kind == "sim_signed")
        _, real = metrics.split_slots(a, nq, nk)
        alphas.append(metrics.importance_profile(real, 10))
        entropy = metrics.attention_entropy(a[..., nq:, :], admitted[nq:]).nanmean(0)
        logit = metrics.max_attention_logit(out.queries[l], out.keys[l], admitted[-T:, -T:]).amax(0)
        out_norm = metrics.head_output_norm(out.head_outputs[l]).mean(0)
        for h in range(a.shape[1]):
            expect |= {N.head(N.HEAD_ENTROPY, l, h): entropy[h], N.head(N.HEAD_MAX_LOGIT, l, h): logit[h]}
            expect[N.head(N.HEAD_OUT_NORM, l, h)] = out_norm[h]
        expect[N.layer(N.MAX_LOGIT, l)] = logit.max()
        hidden = out.hidden_states[l].float()
        expect[N.layer(N.MASSIVE_RATIO, l)] = metrics.massive_activation_ratio(hidden[:, nq:]).mean()
        expect[N.layer(N.VALUE_NORM_RATIO, l)] = metrics.first_token_norm_ratio(out.values[l]).mean()
        for name, chosen in ((N.BOS_SHARE_TRIGGER, triggers), (N.BOS_SHARE_OTHER, ~triggers)):
            expect[N.layer(name, l)] = metrics.first_key_share(real, chosen).nanmean(0).mean()
        expect[N.layer(N.act("kurtosis_pooled"), l)] = outliers.kurtosis(hidden).mean()
        expect[N.layer(N.act("max_abs"), l)] = outliers.max_abs(hidden).mean()
        expect[N.layer(N.FLOW_ENTROPY, l)] = matrix_entropy(hidden[:, nq:]).mean()
        expect[N.layer(N.SECONDARY_SHARE, l)] = secondary_sinks.attention_share(real, 0.3, 1, 8).mean()
    alpha = torch.stack(alphas, 1)
    expect[N.SINK1] = metrics.sink_rate(alpha[..., 0])
    expect |= {N.sink_k(k + 1): metrics.sink_rate(alpha[..., k]) for k in range(alpha.shape[-1])}
    return {k: float(v) for k, v in expect.items()}


@pytest.mark.parametrize(
    "overrides",
    [{}, {"attention": {"op": "kernel", "feature_map": "elu1"}}, {"sink_tokens": 2, "biases": {"kind": "kv"}}],
    ids=["softmax", "elu1", "sink-tokens-and-kv-slot"],
)
def test_every_logged_value_equals_the_pure_functions_layer_by_layer(overrides):
    model, tokens = _model(**overrides), _tokens()
    trigger_ids = [3, 5, 7]
    report = run_probe(
        model, tokens, output_qkv=True, trigger_ids=trigger_ids, mixing_sequences=TRAINING_MIXING_SEQUENCES
    )
    logged = report.to_metrics() | report.head_metrics()
    expect = _by_layer(model, tokens, torch.isin(tokens, torch.tensor(trigger_ids)))
    assert set(expect) <= set(logged)
    for name, value in expect.items():
        assert logged[name] == pytest.approx(value, rel=1e-5, abs=1e-6, nan_ok=True), name


def _batch(hidden):
    B, L, T, _ = hidden.shape
    maps = torch.eye(T).expand(B, L, 1, T, T)
    return ProbeBatch(maps=maps, admitted=metrics.causal_admitted(T, T), n_key_slots=0, hidden=hidden)


def test_kaul_kurtosis_is_per_token_over_the_channels_first_token_apart():
    """One spike among 4 channels: κ = E[(x−μ)⁴]/E[(x−μ)²]² = 21/9 = 7/3; ±1 alternating: κ = 1.
    The pooled kurtosis of the same [T, d] tensor is neither."""
    spike, flat = torch.tensor([0.0, 0.0, 0.0, 4.0]), torch.tensor([1.0, -1.0, 1.0, -1.0])
    hidden = torch.stack([spike, flat, flat])[None, None]  # [B=1, L=1, T=3, d=4]
    assert outliers.token_kurtosis(hidden)[0, 0].tolist() == pytest.approx([7 / 3, 1.0, 1.0])
    values = probe_metrics.measure(_batch(hidden))
    assert values["kurtosis_first"].item() == pytest.approx(7 / 3)
    assert values["kurtosis_rest"].item() == pytest.approx(1.0)
    assert outliers.kurtosis(hidden[0, 0]).item() not in (pytest.approx(7 / 3), pytest.approx(1.0))


def test_kaul_kurtosis_is_logged_per_layer_and_as_the_mean_over_layers():
    hidden = torch.randn(3, 2, 8, 16, generator=torch.Generator().manual_seed(0))
    hidden[:, 1, 0, 0] = 50.0  # layer 1's first token: one massive channel
    values = probe_metrics.reduced({k: [v] for k, v in probe_metrics.measure(_batch(hidden)).items()})
    logged = probe_metrics.to_metrics(values)
    first = [logged[N.layer(N.act("kurtosis_first"), l)] for l in range(2)]
    assert first[1] > 10 > first[0]
    assert logged[N.act("kurtosis_first")] == pytest.approx(sum(first) / 2)
    assert logged[N.act("kurtosis_rest")] < 10


def test_a_registered_metric_reaches_the_report_its_names_and_its_json(monkeypatch):
    """One function and one registration: the accumulator, to_metrics, head_metrics and to_json read it."""
    registry = dict(probe_metrics.REGISTRY)
    monkeypatch.setattr(probe_metrics, "REGISTRY", registry)
    probe_metrics.register(
        probe_metrics.ProbeMetric(
            "diagonal", "head", lambda b: b.real.diagonal(dim1=-2, dim2=-1).mean(-1), "max", "sink/diag", "mean", "max"
        )
    )
    acc = SinkAccumulator()
    acc.add([torch.eye(4).expand(2, 3, 4, 4)] * 2)
    report = acc.measures()
    assert report.diagonal.shape == (2, 3) and report.to_json()["diagonal"] == [[1.0] * 3] * 2
    assert report.to_metrics()["sink/diag_l1"] == 1.0 and report.to_metrics()["sink/diag"] == 1.0
    with pytest.raises(ValueError, match="registered twice"):
        probe_metrics.register(registry["diagonal"])


def test_the_per_head_names_come_from_the_registry():
    assert probe_metrics.head_names() == (N.HEAD_ENTROPY, N.HEAD_OUT_NORM, N.HEAD_MAX_LOGIT)
