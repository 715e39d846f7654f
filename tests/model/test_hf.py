"""The default variant is HF LlamaForCausalLM, with qk-norm Qwen3ForCausalLM: logits match in fp32
both ways; every other variant exports as remote code (tests/model/test_hf_remote.py)."""

import hashlib
import json
from pathlib import Path

import pytest
import torch

from pipeline.export import main
from pipeline.model import ModelConfig, Transformer, save_pretrained
from pipeline.model.hf_native import NotNative, from_hf, native_architecture, to_hf

transformers = pytest.importorskip("transformers")


def _model(**overrides):
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("micro", init_std=0.2, rope_theta=500.0, norm_eps=1e-6, **overrides)
    model = Transformer(cfg).eval()
    with torch.no_grad():  # non-trivial norm gains, so the map is tested
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


def _llama(seed: int, heads: int, kv_heads: int, tie: bool = False):
    """A random 2-layer HF Llama, d = 48."""
    torch.manual_seed(seed)
    hf_cfg = transformers.LlamaConfig(
        vocab_size=50,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
        initializer_range=0.2,
    )
    return transformers.LlamaForCausalLM(hf_cfg).eval()


def test_import_from_hf_llama_matches_logits():
    hf = _llama(seed=1, heads=4, kv_heads=4)
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


def test_qk_norm_is_a_qwen3_both_ways(tmp_path):
    model = _model(attention={"qk_norm": True})
    with torch.no_grad():  # non-trivial q/k norm gains
        for block in model.blocks:
            block.attn.q_norm.weight.uniform_(0.5, 1.5)
            block.attn.k_norm.weight.uniform_(0.5, 1.5)
    hf = to_hf(model)
    assert type(hf).__name__ == "Qwen3ForCausalLM"
    idx = torch.randint(0, 64, (2, 17))
    with torch.no_grad():
        ours = model(idx).logits
        torch.testing.assert_close(hf(idx).logits, ours, atol=1e-5, rtol=1e-5)
        hf.save_pretrained(tmp_path)
        back = from_hf(str(tmp_path))
        assert back.config.attention.qk_norm
        torch.testing.assert_close(back(idx).logits, ours, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(positional="alibi"), "arch.positional"),
        (dict(attention={"op": "sigmoid", "normalizer": "none"}), "arch.attention.op"),
        (dict(sink_tokens=1), "arch.sink_tokens"),
        (dict(biases={"kind": "kv"}), "arch.biases.kind"),
        (dict(ffn="gelu"), "arch.ffn"),
        (dict(norm="layernorm"), "arch.norm"),
        (dict(attention={"qk_norm": True, "gated": True}), "arch.attention.gated"),
        (dict(attention={"gated": True, "gate_granularity": "elementwise"}), "arch.attention.gated"),
        (dict(mask="sliding", window=4), "arch.mask"),
    ],
)
def test_variants_no_hf_class_expresses_are_refused_natively_and_exported_as_remote_code(
    tmp_path, capsys, overrides, field
):
    model = _model(**overrides)
    assert native_architecture(model.config) is None
    with pytest.raises(NotNative, match=field.replace(".", r"\.")):
        to_hf(model)
    save_pretrained(model, tmp_path / "run")
    assert main([str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    assert "remote code" in capsys.readouterr().out
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "sinklab" and config["auto_map"]["AutoModelForCausalLM"].endswith(
        ".SinkLabForCausalLM"
    )


def _listing(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("target", ["run dir", "current dir", "user folder", "earlier export plus a user file"])
def test_export_never_deletes_what_it_did_not_write(tmp_path, capsys, monkeypatch, target):
    """`export-hf CKPT --out DIR` replaces only an earlier export of its own (never the run's
    checkpoints or the current directory's contents), and refuses the rest in one line with nothing
    touched, before the model is loaded."""
    run = tmp_path / "run"
    ckpt = save_pretrained(_model(), run / "checkpoints" / "step-000010")
    (run / "metrics.jsonl").write_text("{}\n")
    out = {
        "run dir": run,
        "current dir": Path("."),
        "user folder": tmp_path / "mine",
        "earlier export plus a user file": tmp_path / "hf",
    }[target]
    monkeypatch.chdir(run if target == "current dir" else tmp_path)
    if target == "user folder":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    if target.startswith("earlier export"):
        assert main([str(ckpt), "--out", str(out)]) == 0
        (out / "notes.txt").write_text("mine")
    before = _listing(tmp_path)
    capsys.readouterr()
    monkeypatch.setattr("pipeline.model.load_pretrained", lambda *a, **k: pytest.fail("refused only after loading"))
    assert main([str(ckpt), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sinklab export-hf: ")
    assert ("current directory" if target == "current dir" else "nothing was changed") in err[0]
    assert _listing(tmp_path) == before


def test_an_earlier_export_is_replaced_and_a_garbage_checkpoint_refused_in_one_line(tmp_path, capsys):
    ckpt = save_pretrained(_model(), tmp_path / "ckpt")
    assert main([str(ckpt), "--out", str(tmp_path / "hf")]) == 0
    assert main([str(ckpt), "--out", str(tmp_path / "hf"), "--dtype", "bfloat16"]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["dtype"] == "bfloat16"
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint")
    capsys.readouterr()
    assert main([str(garbage), "--out", str(tmp_path / "hf2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "garbage.ckpt: not a readable checkpoint" in err[0]
    assert not (tmp_path / "hf2").exists()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c: c["attention"].update(op="ssmax_v9"), "arch.attention.op='ssmax_v9': allowed values are"),
        (lambda c: c.update(arch_from_the_future=1), "unknown field arch.arch_from_the_future"),
    ],
)
def test_a_checkpoint_too_new_for_this_code_is_refused_in_one_line(tmp_path, capsys, change, message):
    ckpt = save_pretrained(_model(), tmp_path / "ckpt")
    config = json.loads((ckpt / "sinklab_config.json").read_text())
    change(config)
    (ckpt / "sinklab_config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert main([str(ckpt), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and not (tmp_path / "hf").exists()


def test_an_export_of_a_newer_format_is_refused_in_one_line(tmp_path):
    from pipeline.model import load_pretrained
    from pipeline.model.hf_modeling import SinkLabConfig

    save_pretrained(_model(sink_tokens=1), tmp_path / "ckpt")
    assert main([str(tmp_path / "ckpt"), "--out", str(tmp_path / "hf")]) == 0
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert load_pretrained(tmp_path / "hf").config.sink_tokens == 1  # SinkLab reads its own export
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "sinklab_format": 2}))
    with pytest.raises(ValueError, match="sinklab_format=2, this SinkLab reads format 1 at most"):
        load_pretrained(tmp_path / "hf")
    with pytest.raises(ValueError, match="sinklab_format=2, but this code reads format 1 at most"):
        SinkLabConfig.from_pretrained(tmp_path / "hf")


def _tokenizer(path: Path, ids: int) -> str:
    """A word-level tokenizer.json of ``ids`` ids at ``path``; its sha256."""
    from tokenizers import Tokenizer, models

    path.parent.mkdir(parents=True, exist_ok=True)
    vocab = {"<|bos|>": 0, "<|eos|>": 1} | {f"w{i}": i for i in range(2, ids)}
    Tokenizer(models.WordLevel(vocab, unk_token="w2")).save(str(path))
    return hashlib.sha256(path.read_text(encoding="utf-8").encode()).hexdigest()


def test_a_tokenizer_that_is_not_the_models_is_refused(tmp_path, capsys):
    """`export-hf CKPT --tokenizer other/tokenizer.json` exported a 48-id tokenizer beside a
    64-id model with exit 0, though the checkpoint records its tokenizer's sha256."""
    model = _model()
    ours = _tokenizer(tmp_path / "ours" / "tokenizer.json", 64)
    other = _tokenizer(tmp_path / "other" / "tokenizer.json", 48)
    _tokenizer(tmp_path / "wide" / "tokenizer.json", 80)
    ckpt, bare = tmp_path / "step-000010.ckpt", tmp_path / "sd.pt"
    hparams = {"arch": model.config.to_dict(), "tokenizer_sha256": ours}
    torch.save(
        {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, "hyper_parameters": hparams}, ckpt
    )
    torch.save(model.state_dict(), bare)
    (tmp_path / "config.json").write_text(json.dumps(model.config.to_dict()))
    refusals = [
        (
            [str(ckpt)],
            "other",
            f"not the model's (sha256 {other[:12]}, 48 ids; the model's: sha256 {ours[:12]}, vocabulary 64)",
        ),
        (
            [str(bare), "--config", str(tmp_path / "config.json")],
            "wide",
            "holds 80 ids, more than the model's vocabulary of 64",
        ),
    ]
    for source, name, message in refusals:
        capsys.readouterr()
        assert (
            main([*source, "--out", str(tmp_path / "hf"), "--tokenizer", str(tmp_path / name / "tokenizer.json")]) == 2
        )
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
        assert not (tmp_path / "hf").exists()
    assert (
        main([str(ckpt), "--out", str(tmp_path / "hf"), "--tokenizer", str(tmp_path / "ours" / "tokenizer.json")]) == 0
    )
    assert json.loads((tmp_path / "hf" / "tokenizer.json").read_text())["model"]["vocab"]["w63"] == 63


def _gqa_llama(seed=2, tie=False):
    return _llama(seed, heads=6, kv_heads=2, tie=tie).double()


@pytest.fixture
def float64_hf_norms(monkeypatch):
    """HF's RMSNorm computes in float32 whatever its input; here in the input's dtype, as SinkLab's does."""

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    monkeypatch.setattr(transformers.models.llama.modeling_llama.LlamaRMSNorm, "forward", forward)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_gqa_llama_imports_and_exports_exactly_in_float64(tie, float64_hf_norms):
    hf = _gqa_llama(tie=tie)
    ours = from_hf(hf).eval()
    assert (ours.config.n_heads, ours.config.n_kv_heads, ours.config.tie_embeddings) == (6, 2, tie)
    idx = torch.randint(0, 50, (2, 17))
    with torch.no_grad():
        assert (ours(idx).logits - hf(idx).logits).abs().max() <= 1e-9
        back = to_hf(ours).double()  # and back: a GQA SinkLab model as a native Llama
        assert back.config.num_key_value_heads == 2
        assert (back(idx).logits - ours(idx).logits).abs().max() <= 1e-9


def test_gqa_model_exports_through_the_command_and_loads_with_automodel(tmp_path, float64_hf_norms):
    model = _model(d_model=48, n_heads=6, n_kv_heads=2).double()
    save_pretrained(model.float(), tmp_path / "run")
    assert main([str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float64).eval()
    assert hf.config.num_key_value_heads == 2
    idx = torch.randint(0, 64, (2, 11))
    with torch.no_grad():
        assert (hf(idx).logits - model.double()(idx).logits).abs().max() <= 1e-9


def test_gqa_variant_exports_as_remote_code_and_loads_with_automodel(tmp_path):
    model = _model(d_model=48, n_heads=6, n_kv_heads=2, attention={"sink_logit": True})
    with torch.no_grad():
        for block in model.blocks:
            block.attn.sink_logit.normal_(0.0, 1.0)
    save_pretrained(model, tmp_path / "run")
    assert main([str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True).eval()
    assert hf.config.num_key_value_heads == 2
    idx = torch.randint(0, 64, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model(idx).logits, atol=1e-6, rtol=1e-6)


def test_smollm2_imports_exactly():
    """The real SmolLM2-135M (9 query heads, 3 key/value heads, tied embeddings) against transformers."""
    from pipeline.model.hf_sources import hf_directory

    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_directory("smollm2")[1], dtype=torch.float32).eval()
    ours = from_hf(hf).eval()
    c = ours.config
    assert (c.n_heads, c.n_kv_heads, c.tie_embeddings) == (9, 3, True)
    idx = torch.tensor([[1, 504, 3458, 282, 3436, 314, 253, 1789, 30, 378, 8331, 314]])
    with torch.no_grad():
        theirs, mine = hf(idx).logits, ours(idx).logits
    assert theirs.abs().mean() > 1.0
    torch.testing.assert_close(mine, theirs, atol=2e-4, rtol=1e-4)
