"""The probe's registered metrics: values against the pure functions layer by layer, Kaul et al.'s
kurtosis by hand, and the registry as the one list the names are read from."""

import pytest
import torch

from pipeline import metric_names as N
from pipeline import metrics, outliers, probe_metrics, secondary_sinks
from pipeline.flow import TRAINING_MIXING_SEQUENCES, matrix_entropy
from pipeline.model import ModelConfig, Transformer
from pipeline.model.masks import admitted_with_extra
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
    nq, nk, T = out.n_extra_queries, out.n_extra_keys, tokens.shape[1]
    admitted = admitted_with_extra(model.config, T)
    expect, alphas = {}, []
    for l, a in enumerate(out.attentions):
        a = a.float()
        if out.attention_kind != "probs":
            a = metrics.proxy_scores(a, signed=out.attention_kind == "sim_signed")
        _, real = metrics.split_extra(a, nq, nk)
        alphas.append(metrics.importance_profile(real, 10))
        entropy = metrics.attention_entropy(a[..., nq:, :], admitted[nq:]).nanmean(0)
        logit = metrics.max_attention_logit(out.queries[l], out.keys[l], admitted[-T:, -T:]).amax(0)
        out_norm = metrics.head_output_norm(out.head_outputs[l]).mean(0)
        for h in range(a.shape[1]):
            expect |= {N.head("heads/entropy", l, h): entropy[h], N.head("heads/max_logit", l, h): logit[h]}
            expect[N.head("heads/out_norm", l, h)] = out_norm[h]
        expect[N.layer("attn/max_logit", l)] = logit.max()
        hidden = out.hidden_states[l].float()
        expect[N.layer("act/massive_ratio", l)] = metrics.first_token_norm_ratio(hidden[:, nq:]).mean()
        expect[N.layer("act/value_norm_ratio", l)] = metrics.first_token_norm_ratio(out.values[l]).mean()
        for name, chosen in (("sink/bos_share_trigger", triggers), ("sink/bos_share_other", ~triggers)):
            expect[N.layer(name, l)] = metrics.first_key_share(real, chosen).nanmean(0).mean()
        expect[N.layer(N.act("kurtosis_pooled"), l)] = outliers.kurtosis(hidden).mean()
        expect[N.layer(N.act("max_abs"), l)] = outliers.max_abs(hidden).mean()
        expect[N.layer(N.FLOW_ENTROPY, l)] = matrix_entropy(hidden[:, nq:]).mean()
        expect[N.layer("sink/secondary_share", l)] = secondary_sinks.attention_share(real, 0.3, 1, 8).mean()
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
    measures = run_probe(
        model, tokens, output_qkv=True, trigger_ids=trigger_ids, mixing_sequences=TRAINING_MIXING_SEQUENCES
    )
    logged = measures.to_metrics() | measures.head_metrics()
    expect = _by_layer(model, tokens, torch.isin(tokens, torch.tensor(trigger_ids)))
    assert set(expect) <= set(logged)
    for name, value in expect.items():
        assert logged[name] == pytest.approx(value, rel=1e-5, abs=1e-6, nan_ok=True), name


def _batch(hidden):
    B, L, T, _ = hidden.shape
    maps = torch.eye(T).expand(B, L, 1, T, T)
    return ProbeBatch(maps=maps, admitted=metrics.causal_admitted(T, T), n_extra_keys=0, hidden=hidden)


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


@pytest.fixture
def diagonal(monkeypatch):
    """A metric registered as a new one is: one function and its ``@register``, nothing else."""
    monkeypatch.setattr(probe_metrics, "REGISTRY", dict(probe_metrics.REGISTRY))

    @probe_metrics.register(
        per="head", over_sequences="max", namespace=N.SINK, over_layers="max", per_head=True, extreme_token=True
    )
    def diagonal(b: ProbeBatch) -> torch.Tensor:
        """How much each query attends to itself."""
        return b.real.diagonal(dim1=-2, dim2=-1).mean(-1)

    return diagonal


def test_a_registered_metric_reaches_every_reader(diagonal):
    """The accumulator, the measures' attribute and JSON, its MLflow names, the extreme-token set, the per-head
    names the MLflow view keeps apart, and docs/training.md's table all read the registration."""
    from regen_docs_tables import metric_table

    from pipeline.tracking.views import sent_to_mlflow

    acc = SinkAccumulator()
    acc.add([torch.eye(4).expand(2, 3, 4, 4)] * 2)
    measures = acc.measures()
    assert measures.diagonal.shape == (2, 3) and measures.to_json()["diagonal"] == [[1.0] * 3] * 2
    assert measures.to_metrics()["sink/diagonal_l1"] == 1.0 and measures.to_metrics()["sink/diagonal"] == 1.0
    assert measures.head_metrics()["heads/diagonal_l1_h2"] == 1.0
    extreme = measures.extreme_token_metrics()
    assert {k: v for k, v in extreme.items() if "diagonal" in k} == {
        f"sink/diagonal{s}": 1.0 for s in ("_l0", "_l1", "")
    }
    assert probe_metrics.name("diagonal") == "sink/diagonal" and "heads/diagonal" in probe_metrics.head_names()
    assert not sent_to_mlflow("heads/diagonal_l0_h1") and sent_to_mlflow("sink/diagonal_l0")
    row = next(line for line in metric_table() if line.startswith("| `diagonal` |"))
    assert "`sink/diagonal_l{l}` (mean over heads)" in row and "How much each query attends to itself." in row
    with pytest.raises(ValueError, match="registered twice"):
        probe_metrics.register(per="layer")(diagonal)


def test_a_registration_is_keyword_only_and_its_namespace_known():
    with pytest.raises(TypeError):
        probe_metrics.ProbeMetric("diagonal", lambda b: None, "head")
    with pytest.raises(ValueError, match="namespace 'diag/' is none of metric_names'"):
        probe_metrics.register(per="layer", namespace="diag/")(lambda b: None)


def test_a_metric_no_probe_can_measure_is_nan_where_so_registered():
    acc = SinkAccumulator()
    acc.add([torch.eye(4).expand(2, 3, 4, 4)] * 2)  # no hidden states
    unmeasured = {k for k, m in probe_metrics.REGISTRY.items() if m.nan_when_unmeasured}
    assert unmeasured == {"massive_ratio"}
    assert torch.isnan(acc.measures().massive_ratio).all() and acc.measures().kurtosis_first is None


def test_the_docs_table_of_metrics_is_the_registry():
    from regen_docs_tables import COMMAND, REPO, rendered

    assert rendered("training.md") == (REPO / "docs" / "training.md").read_text(), f"docs are stale: run `{COMMAND}`"


def test_the_per_head_names_come_from_the_registry():
    assert probe_metrics.head_names() == ("heads/entropy", "heads/out_norm", "heads/max_logit")
