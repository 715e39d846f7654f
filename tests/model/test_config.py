import json

import pytest
import torch

from pipeline.model import PRESETS, ConfigError, ModelConfig, Transformer


def _non_embedding_params(name: str) -> int:
    with torch.device("meta"):
        return Transformer(ModelConfig.from_preset(name)).num_parameters(embeddings=False)


def test_presets_have_the_documented_shapes():
    c = ModelConfig.from_preset("llama-60m")
    assert (c.d_model, c.n_layers, c.n_heads, c.d_ffn) == (768, 10, 8, 1536)
    assert (c.positional, c.norm_position, c.ffn, c.tie_embeddings) == ("rope", "pre", "swiglu", False)
    tiny = ModelConfig.from_preset("tiny")
    assert (tiny.d_model, tiny.n_layers, tiny.n_heads, tiny.d_ffn) == (128, 4, 4, 512)
    assert set(PRESETS) >= {"llama-60m", "llama-1b", "tiny", "micro", "bb", "bb-tiny"}
    bb = ModelConfig.from_preset("bb-tiny", ffn="relu", positional="learned")
    assert (bb.d_model, bb.n_layers, bb.n_heads, bb.d_ffn, bb.max_seq_len, bb.ffn) == (32, 1, 1, 128, 32, "relu")


def test_60m_preset_counts_about_60m_parameters_without_embeddings():
    # per layer: 4 d^2 (attention) + 3 d f (SwiGLU) + 2 d (norms); plus the final norm
    d, f, L = 768, 1536, 10
    expected = L * (4 * d * d + 3 * d * f + 2 * d) + d
    assert _non_embedding_params("llama-60m") == expected == 58_998_528


def test_the_elementwise_gate_adds_a_d_by_d_matrix_per_layer_the_headwise_one_d_by_h():
    d, H, L = 768, 8, 10
    base = _non_embedding_params("llama-60m")
    for granularity, extra in (("headwise", d * H), ("elementwise", d * d)):
        arch = ModelConfig.from_preset("llama-60m", attention={"gated": True, "gate_granularity": granularity})
        with torch.device("meta"):
            assert Transformer(arch).num_parameters(embeddings=False) == base + L * extra


def test_1b_preset_is_about_a_billion():
    assert 1.0e9 < _non_embedding_params("llama-1b") < 1.2e9


def test_overrides_nested_and_roundtrip():
    c = ModelConfig.from_preset("micro", attention={"op": "sigmoid", "normalizer": "none"}, biases__kind="k")
    assert c.attention.op == "sigmoid" and c.attention.normalizer == "none" and c.biases.kind == "k"
    again = ModelConfig.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again == c


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(positional="xpos"), "arch.positional"),
        (dict(attention__op="tanh"), "arch.attention.op"),
        (dict(n_heads=3), "arch.n_heads"),
        (dict(mask="sliding"), "arch.window"),
        (dict(mask="prefix"), "arch.prefix_len"),
        (dict(biases__key_dims=4), "arch.biases.key_dims"),
        (dict(attention__op="sigmoid", attention__sink_logit=True), "arch.attention.sink_logit"),
        (dict(attention__op="kernel", positional="alibi"), "arch.positional"),
        (dict(attention__normalizer="none"), "arch.attention.normalizer"),
        (dict(sink_tokens=9), "arch.sink_tokens"),
        (dict(attention__gate_granularity="elementwise"), "arch.attention.gate_granularity"),
        (dict(attention__gated=True, attention__gate_granularity="channel"), "arch.attention.gate_granularity"),
        (dict(colour="red"), "arch.colour"),
    ],
)
def test_bad_values_name_the_field(overrides, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        ModelConfig.from_preset("micro", **overrides)


@pytest.mark.parametrize(
    "old,new,value",
    [("kernel", "feature_map", "elu1"), ("scale", "alpha", 0.5)],
)
def test_an_attention_fields_older_name_is_refused_with_todays(old, new, value):
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_preset("micro", attention__op="kernel", **{f"attention__{old}": value})
    assert str(err.value) == f"arch.attention.{old} is now arch.attention.{new}; give it under that name"
    assert getattr(ModelConfig.from_preset("micro", **{f"attention__{new}": value}).attention, new) == value


@pytest.mark.parametrize(
    "section, old, message",
    [
        ("attention", "kernel", "arch.attention.kernel is now arch.attention.feature_map; give it under that name"),
        ("attention", "colour", "unknown field arch.attention.colour; allowed: "),
        ("biases", "colour", "unknown field arch.biases.colour; allowed: "),
    ],
)
def test_a_section_given_as_a_dict_names_its_fields_as_from_preset_does(section, old, message):
    with pytest.raises(ConfigError) as err:
        ModelConfig(**{section: {old: 1}})
    assert str(err.value).startswith(message)


def test_unknown_preset_lists_the_allowed_ones():
    with pytest.raises(ConfigError, match="llama-60m"):
        ModelConfig.from_preset("gpt-5")


def test_jsonargparse_overrides_every_nested_field():
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_argument("--arch", type=ModelConfig, default=ModelConfig.from_preset("tiny"))
    args = parser.parse_args(
        [
            "--arch.attention.op",
            "sigmoid",
            "--arch.attention.normalizer",
            "none",
            "--arch.biases.kind",
            "kv",
            "--arch.d_model",
            "64",
        ]
    )
    cfg = parser.instantiate(args).arch
    assert isinstance(cfg, ModelConfig)
    assert (cfg.attention.op, cfg.biases.kind, cfg.d_model, cfg.n_layers) == ("sigmoid", "kv", 64, 4)


def test_a_preset_fills_only_the_shape_fields_left_unset():
    tiny = ModelConfig.from_preset("tiny")
    wide = ModelConfig(preset="tiny", n_heads=2, d_ffn=1024)
    assert (wide.d_model, wide.n_layers, wide.n_heads, wide.d_ffn) == (tiny.d_model, tiny.n_layers, 2, 1024)
    assert wide.preset == "tiny" and ModelConfig.from_dict(wide.to_dict()) == wide
    default, paper = ModelConfig(), ModelConfig.from_preset("llama-60m")
    assert default.preset is None and default.replace(preset="llama-60m") == paper
    with pytest.raises(ConfigError, match=r"arch\.preset='gpt-5': unknown preset; allowed: llama-60m"):
        ModelConfig(preset="gpt-5")
    with pytest.raises(ConfigError, match=r"arch\.d_model='wide': expected int"):
        ModelConfig(preset="tiny", d_model="wide")
