"""The default variant is HF LlamaForCausalLM: logits match in fp32 both ways."""
import pytest
import torch

from pipeline.model import ModelConfig, Transformer, save_pretrained
from pipeline.model.hf_export import NotALlama, from_hf, main, to_hf

transformers = pytest.importorskip("transformers")


def _model(**overrides):
    torch.manual_seed(0)
    cfg = ModelConfig.preset("micro", init_std=0.2, rope_theta=500.0, norm_eps=1e-6, **overrides)
    model = Transformer(cfg).eval()
    with torch.no_grad():                          # non-trivial norm gains, so the map is tested
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


def test_export_matches_hf_llama_logits():
    model = _model()
    hf = to_hf(model)
    idx = torch.randint(0, 64, (2, 19))
    with torch.no_grad():
        ours, theirs = model(idx).logits, hf(idx).logits
    assert ours.abs().mean() > 0.1
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_import_from_hf_llama_matches_logits():
    torch.manual_seed(1)
    hf_cfg = transformers.LlamaConfig(
        vocab_size=50, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=64,
        tie_word_embeddings=False, initializer_range=0.2,
    )
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    ours = from_hf(hf).eval()
    assert (ours.config.d_model, ours.config.n_heads, ours.config.d_ffn) == (48, 4, 80)
    idx = torch.randint(0, 50, (2, 13))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx).logits, hf(idx).logits, atol=1e-5, rtol=1e-5)


def test_export_hf_command_writes_a_loadable_llama(tmp_path, capsys):
    model = _model()
    save_pretrained(model, tmp_path / "run")
    assert main([str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    assert "LlamaForCausalLM" in capsys.readouterr().out
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    idx = torch.randint(0, 64, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model(idx).logits, atol=1e-5, rtol=1e-5)
    back = from_hf(str(tmp_path / "hf"))
    torch.testing.assert_close(back.lm_head.weight, model.lm_head.weight)


@pytest.mark.parametrize(
    "overrides, field",
    [(dict(positional="alibi"), "model.positional"), (dict(attention={"op": "sigmoid", "normalizer": "none"}), "model.attention.op"),
     (dict(sink_tokens=1), "model.sink_tokens"), (dict(biases={"kind": "kv"}), "model.biases.kind"),
     (dict(ffn="gelu"), "model.ffn"), (dict(norm="layernorm"), "model.norm"), (dict(attention={"qk_norm": True}), "model.attention.qk_norm")],
)
def test_variants_hf_cannot_express_are_refused_naming_the_field(tmp_path, capsys, overrides, field):
    model = _model(**overrides)
    with pytest.raises(NotALlama, match=field.replace(".", r"\.")):
        to_hf(model)
    save_pretrained(model, tmp_path / "run")
    assert main([str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 2
    assert field in capsys.readouterr().out
    assert not (tmp_path / "hf").exists()
