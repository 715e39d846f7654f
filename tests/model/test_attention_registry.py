"""The registry of attention operations: every consumer reads an op's one entry in
attention_ops.OPS, picks up an op registered there, and refuses an unknown one loudly."""

import dataclasses
import math
from typing import get_args

import pytest
import torch
import torch.nn.functional as F

import pipeline.model.attention as attention_module
from pipeline.model import ConfigError, ModelConfig, Transformer
from pipeline.model.attention_ops import (
    OPS,
    SCORE_KINDS,
    OpResult,
    OpSpec,
    _admitted,
    build_feature_map,
    normalize,
    op_spec,
    proxy_label,
    register,
    scaled_scores,
    sigmoid_op,
    softmax_op,
)
from pipeline.model.config import AttentionOp
from pipeline.probe import ATTENTION_KINDS, run_probe

BUILT_IN = tuple(OPS)


def softplus_op(q, k, mask, a, feature_map):
    """softplus(s) / Z_i."""
    admitted = _admitted(mask)
    sim = torch.where(admitted, F.softplus(scaled_scores(q, k, mask.masked_fill(~admitted, 0.0))), 0.0)
    return OpResult(normalize(sim, a.normalizer, a.p), sim)


DUMMIES = {  # name: (entry, the path its training step takes)
    "test_softplus": (
        OpSpec(name="test_softplus", fn=softplus_op, scores="sim_nonneg", normalizers=("sum", "none")),
        "eager",
    ),
    "test_sigmoid_tiles": (
        OpSpec(name="test_sigmoid_tiles", fn=sigmoid_op, scores="sim_nonneg", tiles="sigmoid"),
        "blocked",
    ),
    "test_softmax_sdpa": (
        OpSpec(name="test_softmax_sdpa", fn=softmax_op, scores="probs", softmax=True, sdpa=True),
        "sdpa",
    ),
}


@pytest.fixture
def dummies():
    for spec, _ in DUMMIES.values():
        register(spec)
    yield
    for name in DUMMIES:
        OPS.pop(name, None)


def _counted(fn, calls, path):
    def wrapper(*args, **kwargs):
        calls[path] += 1
        return fn(*args, **kwargs)

    return wrapper


def _micro(op, seed=0, **attention):
    torch.manual_seed(seed)
    return Transformer(ModelConfig.from_preset("micro", init_std=0.2, attention={"op": op, **attention})).eval()


@pytest.mark.parametrize("name", DUMMIES)
def test_a_registered_op_reaches_every_consumer(dummies, name, monkeypatch):
    spec, expected_path = DUMMIES[name]
    calls = {"eager": 0, "blocked": 0, "sdpa": 0}
    monkeypatch.setitem(OPS, name, dataclasses.replace(spec, fn=_counted(spec.fn, calls, "eager")))
    monkeypatch.setattr(
        attention_module, "blocked_attention", _counted(attention_module.blocked_attention, calls, "blocked")
    )
    monkeypatch.setattr(F, "scaled_dot_product_attention", _counted(F.scaled_dot_product_attention, calls, "sdpa"))
    model = _micro(name)
    idx = torch.randint(0, 64, (2, 12))
    fast = model(idx)
    assert calls == {path: (2 if path == expected_path else 0) for path in calls}  # one call per layer
    slow = model(idx, output_attentions=True)
    assert calls["eager"] == 2 + (expected_path == "eager") * 2
    torch.testing.assert_close(fast.logits, slow.logits, atol=1e-5, rtol=1e-5)
    kind = spec.kind(model.config.attention)
    assert fast.attention_kind == slow.attention_kind == kind
    assert (proxy_label(model.config.attention) is None) == (kind == "probs")  # the run summary
    assert run_probe(model, idx, batch_size=2).is_proxy == (kind != "probs")  # the sink probe


def test_the_config_checks_a_registered_op_against_its_entry(dummies):
    assert (
        ModelConfig.from_preset("micro", attention={"op": "test_softplus", "normalizer": "none"}).attention.op
        == "test_softplus"
    )
    for attention, field in [
        (dict(op="test_softplus", normalizer="abs_clamp"), "normalizer"),  # not among its normalizers
        (dict(op="test_softplus", p=2.0), "p"),  # no p-norm
        (dict(op="test_softplus", sink_logit=True), "sink_logit"),  # not a softmax
    ]:
        with pytest.raises(ConfigError, match=f"arch.attention.{field}"):
            ModelConfig.from_preset("micro", attention=attention)
    assert ModelConfig.from_preset("micro", attention={"op": "test_softmax_sdpa", "sink_logit": True}).n_bias_slots == 1
    assert build_feature_map(ModelConfig.from_preset("micro", attention={"op": "test_softplus"}).attention, 16) is None


def test_unknown_and_unregistered_ops_are_refused_everywhere(dummies):
    del OPS["test_softplus"]
    try:
        with pytest.raises(ConfigError, match="arch.attention.op='test_softplus': allowed values are softmax, "):
            ModelConfig.from_preset("micro", attention={"op": "test_softplus"})
        with pytest.raises(ValueError, match="unknown attention op 'test_softplus'; registered: softmax, "):
            op_spec("test_softplus")
        cfg = ModelConfig.from_preset("micro")
        cfg.attention.op = "test_softplus"  # changed after validation
        with pytest.raises(ValueError, match="unknown attention op 'test_softplus'"):
            Transformer(cfg)
        with pytest.raises(ValueError, match="unknown attention op"):
            proxy_label(cfg.attention)
    finally:
        register(DUMMIES["test_softplus"][0])


@pytest.mark.parametrize(
    "change, problem",
    [
        (dict(name="softmax"), "name 'softmax' is taken"),
        (dict(tiles="relu"), "tiles must be one of sigmoid, elu1, identity"),
        (dict(scores="probabilities"), "scores must be one of probs, sim_nonneg, sim_signed"),
        (dict(normalizers=("sum", "max")), "normalizers must be among sum, abs_clamp, none"),
        (dict(sdpa=True), "sdpa and zero_logit need a softmax op"),
        (dict(fn=lambda q, k, mask, a, phi: None, about=""), "about is empty"),
    ],
)
def test_a_broken_entry_is_refused_when_registered(change, problem):
    entry = dataclasses.replace(DUMMIES["test_softplus"][0], **change)
    with pytest.raises(ValueError, match=problem):
        register(entry)
    assert OPS.get(entry.name) is not entry
    with pytest.raises(TypeError):  # every field by name
        OpSpec("test_positional", softplus_op, "sim_nonneg")


def test_the_cli_lists_the_ops_of_attention_ops_py():
    """jsonargparse shows the Literal's values; ops registered after import are still
    validated through OPS (above) but not listed."""
    assert get_args(AttentionOp) == BUILT_IN
    assert ATTENTION_KINDS == tuple(SCORE_KINDS)


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_registered_op_trains_and_its_training_path_equals_its_eager_path(name):
    spec = OPS[name]
    model = _micro(name, normalizer=spec.normalizers[-1]).double()
    idx = torch.randint(0, 64, (2, 9))
    fast = model(idx).logits
    fast.square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    slow = model(idx, output_attentions=True).logits
    slow.square().mean().backward()
    torch.testing.assert_close(fast, slow, atol=1e-10, rtol=1e-10)
    for a, b in zip(grads, [p.grad for p in model.parameters()], strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize(
    "op, feature_map", [(name, None) for name in BUILT_IN] + [("kernel", "identity"), ("kernel", "mlp")]
)
def test_every_op_and_feature_map_passes_the_whole_sink_probe_training_runs(op, feature_map):
    model = _micro(op, normalizer=OPS[op].normalizers[-1], **({"feature_map": feature_map} if feature_map else {}))
    measures = run_probe(model, torch.randint(0, 64, (2, 12)), batch_size=2)
    metrics = measures.to_metrics()
    assert measures.outliers is not None and "act/linear_max" in metrics and math.isfinite(metrics["sink/alpha1_mean"])


def test_the_run_summary_names_the_proxy_the_sink_metrics_use():
    label = lambda **attention: proxy_label(ModelConfig.from_preset("micro", attention=attention).attention)  # noqa: E731
    assert label(op="softmax") is None and label(op="clipped_softmax") is None
    assert label(op="softmax", p=2.0) == label(op="sigmoid") == "proxy scores sim/Σ sim"
    assert label(op="kernel", feature_map="identity", normalizer="abs_clamp") == "proxy scores |sim|/Σ|sim|"


def test_the_docs_table_of_ops_is_the_registry(dummies):
    """docs/model.md's table is the built-in ops' (a registered op gets its row)."""
    from regen_docs_tables import COMMAND, REPO, op_table, rendered

    assert any(line.startswith("| `test_softplus` | softplus(s) / Z_i. | `sim_nonneg` |") for line in op_table())
    for name in DUMMIES:
        del OPS[name]
    assert rendered("model.md") == (REPO / "docs" / "model.md").read_text(), f"docs are stale: run `{COMMAND}`"
