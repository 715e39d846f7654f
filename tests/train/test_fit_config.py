"""`sinklab fit`'s config before anything is built: a preset named on the command line or in a
recipe, fields beside it, the numbers recorded, and `--check-only` (which writes nothing)."""

from __future__ import annotations

import re

import pytest
import yaml
from fit_runs import REPO, TINY

from pipeline.model import ModelConfig
from pipeline.train.cli import main
from pipeline.train.fit_config import check_fit, fit_parser

EMBEDDED = str(REPO / "configs" / "recipes" / "embedded.yaml")


def test_preset_on_the_command_line_with_a_field_beside_it():
    config = check_fit(["--config", EMBEDDED, "--arch.preset", "llama-1b", "--arch.max_seq_len", "512"])
    model = config.arch
    one_b = ModelConfig.from_preset("llama-1b")
    assert (model.preset, model.d_model, model.n_layers, model.n_heads) == (
        "llama-1b",
        one_b.d_model,
        one_b.n_layers,
        one_b.n_heads,
    )
    assert model.max_seq_len == 512 != one_b.max_seq_len  # given beside the preset: it wins
    # what `sinklab fit` records as the run's config.yaml (and flattens into MLflow params)
    recorded = yaml.safe_load(fit_parser().dump(config, skip_validation=True))["arch"]
    assert recorded["preset"] == "llama-1b" and recorded["d_ffn"] == one_b.d_ffn and recorded["max_seq_len"] == 512
    assert ModelConfig.from_dict(recorded) == ModelConfig.from_preset("llama-1b", max_seq_len=512)


def test_preset_in_a_recipe_with_an_override(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"arch": {"preset": "tiny", "n_heads": 2}, "data": {"path": "d"}}))
    model = check_fit(["--config", str(recipe)]).arch
    assert (model.preset, model.d_model, model.n_heads) == ("tiny", ModelConfig.from_preset("tiny").d_model, 2)
    assert check_fit(["--data.path", "d"]).arch.d_model == ModelConfig().d_model  # no arch section


def test_check_only_accepts_or_refuses_in_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    common = ["--check-only", "--config", TINY, "--data.path", "no-such-dataset", "--run-dir", str(tmp_path / "run")]
    assert main(common + ["--arch.preset", "tiny"]) == 0
    assert "accepted" in capsys.readouterr().out
    assert main(common + ["--arch.preset", "tiny", "--arch.n_heads", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "sinklab fit: arch.n_heads=3: must divide d_model=128", err
    assert main(common + ["--arch.preset", "gpt-5"]) == 2
    assert "arch.preset: Expected a typing.Literal['llama-60m'" in capsys.readouterr().err
    assert main(common + ["--optim.warmup_steps", "10", "--trainer.max_steps", "4"]) == 2  # as a sweep's task would
    err = capsys.readouterr().err.strip()
    assert err == "sinklab fit: optim.warmup_steps=10: must be in [0, trainer.max_steps=4)", err
    assert list(tmp_path.iterdir()) == []


def _repeats(dotted: str) -> bool:
    words = dotted.lstrip("-").replace("_", ".").split(".")
    return len(set(words)) != len(words)


def test_no_flag_recorded_key_or_runs_table_column_repeats_a_word():
    from pipeline.tracking import as_params
    from pipeline.tracking.views import DEFAULT_FACTORS, table_columns
    from pipeline.train.fit_config import as_plain
    from sinklab_io.mappings import flatten

    parser = fit_parser()
    flags = {o for action in parser._actions for o in action.option_strings if o.startswith("--")}
    assert {"--arch.attention.op", "--arch.preset"} <= flags
    config = check_fit(["--config", EMBEDDED])
    recorded = flatten(yaml.safe_load(parser.dump(config, skip_validation=True)))  # the run's config.yaml
    assert {"arch.attention.op", "optim.lr", "trainer.max_steps"} <= set(recorded)  # each is a flag too
    params = as_params(as_plain(config))  # its MLflow params
    assert {"arch.attention.op", "optim.lr"} <= set(params)
    assert not any(k.startswith(("model.arch", "model.optim")) for k in params)
    columns = [c.split("`")[1] for c in table_columns(list(DEFAULT_FACTORS))]
    assert [k for k in (*flags, *recorded, *params, *columns) if _repeats(k)] == []


@pytest.mark.parametrize(
    "old,new,value,section",
    [
        ("arch.attention.kernel", "arch.attention.feature_map", "elu1", {"arch": {"attention": {"kernel": "elu1"}}}),
        ("arch.attention.scale", "arch.attention.alpha", "0.5", {"arch": {"attention": {"scale": 0.5}}}),
        ("model.optim.lr", "optim.lr", "1e-3", {"model": {"optim": {"lr": 1e-3}}}),
    ],
)
def test_an_older_name_is_refused_in_one_line_naming_todays(tmp_path, capsys, old, new, value, section):
    assert main(["--check-only", f"--{old}", value]) == 2
    assert capsys.readouterr().err.strip() == (
        f"sinklab fit: command line: --{old} is now --{new}; give it under that name"
    )
    recipe = tmp_path / "old.yaml"
    recipe.write_text(yaml.safe_dump(section))
    assert main(["--check-only", "--config", str(recipe)]) == 2
    old, new = (old, new) if old.startswith("arch") else ("model.optim", "optim")  # a file names the section
    assert capsys.readouterr().err.strip() == f"sinklab fit: {recipe}: {old} is now {new}; give it under that name"


def test_a_recipe_of_the_older_layout_is_refused_in_one_line(tmp_path, capsys):
    recipe = tmp_path / "old.yaml"
    recipe.write_text(yaml.safe_dump({"model": {"model": {"preset": "tiny"}, "optim": {"lr": 1e-3}}}))
    assert main(["--check-only", "--config", str(recipe)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"sinklab fit: {recipe}: `model.model` is an older config format, no longer read "
        "(today's configs hold the architecture in a top-level `arch:` section)"
    )


def test_every_arch_optim_run_and_data_flag_explains_itself_in_help():
    """`sinklab fit --help`: each field's docstring is the line under its flag (the config files are not fields)."""
    entries = re.split(r"\n(?=  -)", fit_parser().format_help())
    unexplained, seen = [], 0
    for entry in entries:
        flag = re.match(r"  (--(?:arch|optim|run|data)\.\S+)( CONFIG)?", entry)
        if flag is None or flag[1].endswith(".help") or flag[2]:
            continue
        seen += 1
        first, *rest = entry.split("\n")
        text = " ".join([*re.split(r"\s{2,}", first.strip())[1:], *(line.strip() for line in rest)])
        if not text.split("(type:")[0].strip():
            unexplained.append(flag[1])
    assert seen > 60 and unexplained == [], f"fields without a docstring: {unexplained}"
