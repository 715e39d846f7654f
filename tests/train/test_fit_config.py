"""`sinklab fit`'s config before anything is built: a preset named on the command line or in a
recipe, fields beside it, the numbers recorded, and `--check-only` (which writes nothing)."""

from __future__ import annotations

import yaml
from conftest import REPO, TINY

from pipeline.model import ModelConfig
from pipeline.train.cli import main
from pipeline.train.fit_config import check_fit, fit_parser

EMBEDDED = str(REPO / "configs" / "recipes" / "embedded.yaml")


def test_preset_on_the_command_line_with_a_field_beside_it():
    config = check_fit(["--config", EMBEDDED, "--model.model.preset", "llama-1b", "--model.model.max_seq_len", "512"])
    model = config.model.model
    one_b = ModelConfig.from_preset("llama-1b")
    assert (model.preset, model.d_model, model.n_layers, model.n_heads) == (
        "llama-1b",
        one_b.d_model,
        one_b.n_layers,
        one_b.n_heads,
    )
    assert model.max_seq_len == 512 != one_b.max_seq_len  # given beside the preset: it wins
    # what `sinklab fit` records as the run's config.yaml (and flattens into MLflow params)
    recorded = yaml.safe_load(fit_parser().dump(config, skip_validation=True))["model"]["model"]
    assert recorded["preset"] == "llama-1b" and recorded["d_ffn"] == one_b.d_ffn and recorded["max_seq_len"] == 512
    assert ModelConfig.from_dict(recorded) == ModelConfig.from_preset("llama-1b", max_seq_len=512)


def test_preset_in_a_recipe_with_an_override(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"model": {"model": {"preset": "tiny", "n_heads": 2}}, "data": {"path": "d"}}))
    model = check_fit(["--config", str(recipe)]).model.model
    assert (model.preset, model.d_model, model.n_heads) == ("tiny", ModelConfig.from_preset("tiny").d_model, 2)
    assert check_fit(["--data.path", "d"]).model.model.d_model == ModelConfig().d_model  # no model section


def test_check_only_accepts_or_refuses_in_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    common = ["--check-only", "--config", TINY, "--data.path", "no-such-dataset", "--run-dir", str(tmp_path / "run")]
    assert main(common + ["--model.model.preset", "tiny"]) == 0
    assert "accepted" in capsys.readouterr().out
    assert main(common + ["--model.model.preset", "tiny", "--model.model.n_heads", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "sinklab fit: model.n_heads=3: must divide d_model=128", err
    assert main(common + ["--model.model.preset", "gpt-5"]) == 2
    assert "model.model.preset: Expected a typing.Literal['llama-60m'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
