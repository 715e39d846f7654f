"""load_pretrained: export dirs, Lightning .ckpt files and consolidated state dicts."""

import json

import pytest
import torch

from pipeline.model import ConfigError, ModelConfig, Transformer, load_pretrained, save_pretrained


def _model():
    torch.manual_seed(0)
    return Transformer(ModelConfig.from_preset("micro", biases={"kind": "kv"}, sink_tokens=1)).eval()


def _same(a, b):
    idx = torch.randint(0, 64, (1, 7))
    torch.testing.assert_close(a(idx).logits, b(idx).logits, atol=0, rtol=0)


def test_export_dir_roundtrip(tmp_path):
    model = _model()
    out = save_pretrained(model, tmp_path / "export")
    # and the marker that lets a later save replace this directory (and nothing a user wrote)
    assert sorted(p.name for p in out.iterdir()) == [".sinklab-output.json", "model.safetensors", "sinklab_config.json"]
    loaded = load_pretrained(out)
    assert loaded.config == model.config
    _same(model, loaded.eval())


def test_lightning_ckpt(tmp_path):
    model = _model()
    ckpt = {
        "hyper_parameters": {"arch": model.config.to_dict(), "lr": 4e-4},
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "optimizer_states": [],
    }
    torch.save(ckpt, tmp_path / "last.ckpt")
    _same(model, load_pretrained(tmp_path / "last.ckpt").eval())


def test_a_checkpoint_of_the_older_format_is_refused(tmp_path):
    model = _model()
    ckpt = {"hyper_parameters": {"model_config": model.config.to_dict()}, "state_dict": model.state_dict()}
    torch.save(ckpt, tmp_path / "old.ckpt")
    with pytest.raises(ConfigError) as err:
        load_pretrained(tmp_path / "old.ckpt")
    assert str(err.value) == (
        f"{tmp_path / 'old.ckpt'}: hyper_parameters['model_config'] is an older checkpoint format, no longer read "
        "(today's checkpoints hold hyper_parameters['arch'])"
    )


def test_consolidated_state_dict_with_run_config_yaml(tmp_path):
    model = _model()
    torch.save({f"model.{k}": v for k, v in model.state_dict().items()}, tmp_path / "fp32.bin")
    import yaml

    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"arch": model.config.to_dict(), "model": {"lr": 1e-3}}))
    _same(model, load_pretrained(tmp_path / "fp32.bin", config=tmp_path / "config.yaml").eval())
    with pytest.raises(ValueError, match="no model config"):
        load_pretrained(tmp_path / "fp32.bin")


def test_mismatched_weights_are_reported(tmp_path):
    model = _model()
    save_pretrained(model, tmp_path / "export")
    cfg = json.loads((tmp_path / "export" / "sinklab_config.json").read_text())
    cfg["biases"]["kind"] = "none"
    (tmp_path / "export" / "sinklab_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unexpected .*kv_slot"):
        load_pretrained(tmp_path / "export")


def test_weights_of_another_shape_are_one_line(tmp_path):
    """A state dict under a config of another vocabulary raised torch's multi-line size mismatch."""
    model = _model()
    torch.save(model.state_dict(), tmp_path / "sd.pt")
    other = model.config.to_dict() | {"vocab_size": 48}
    with pytest.raises(ValueError, match=r"embed.weight is \[64, 32\], the config builds \[48, 32\] \(vocab_size 48"):
        load_pretrained(tmp_path / "sd.pt", config=other)
