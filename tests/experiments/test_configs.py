"""Every variant's overrides resolve against `sinklab fit`'s real config classes."""

from __future__ import annotations

import copy

import pytest
from experiment_helpers import check_experiment, load_all

from pipeline.experiments.configs import check_config, variant_config
from pipeline.experiments.spec import ExperimentError, load_experiment
from pipeline.model import ModelConfig


def test_every_variant_resolves_at_cpu_scale_and_every_paper_override_too():
    checked = 0
    for experiment in load_all():
        checked += check_experiment(experiment, "cpu")
        # paper scale: the recipe with its base overrides, and every variant that differs there
        paper_variants = [v for v in experiment.variants if v.paper_overrides] or experiment.variants[:1]
        for variant in paper_variants:
            check_config(variant_config(experiment, variant, "paper"), f"{experiment.name}/{variant.name}")
            checked += 1
        if "gpu" in experiment.scales:  # the studies that opted in to one lent GPU, every variant
            checked += check_experiment(experiment, "gpu")
    assert checked > 180


def test_variant_config_applies_overrides_and_identity():
    e = load_experiment("attention-operations")
    config = variant_config(e, e.variant("kernel-mlp-clamp"), "cpu")
    attention = config["arch"]["attention"]
    assert (attention["op"], attention["feature_map"], attention["normalizer"]) == ("kernel", "mlp", "abs_clamp")
    assert config["run"]["experiment"] == "sinklab/attention-operations"
    assert config["run"]["variant"] == "kernel-mlp-clamp"
    assert config["run"]["name"] == "kernel-mlp-clamp s1234 (attention-operations/cpu)"
    assert config["seed_everything"] == config["data"]["seed"] == 1234  # the recipe's seed, for both
    assert ModelConfig.from_dict(config["arch"]).d_model == 128  # the cpu recipe underneath is kept


@pytest.mark.parametrize(
    "path,value,message",
    [
        (("arch", "attention", "op"), "bogus", "arch.attention.op: Expected"),
        (("optim", "lrr"), 1.0, "Option 'lrr' is not accepted"),
        (("arch", "biases"), {"kind": "v", "key_dims": 3}, "key_dims=3: only meaningful for kind"),
    ],
)
def test_wrong_overrides_are_named(path, value, message):
    e = load_experiment("weight-decay")
    config = copy.deepcopy(variant_config(e, e.variants[0], "cpu"))
    node = config
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    with pytest.raises(ExperimentError, match="^weight-decay/wd-0.0: ") as err:
        check_config(config, "weight-decay/wd-0.0")
    assert message in str(err.value)


@pytest.mark.parametrize(
    "section,message",
    [
        (
            "arch",
            "`model.model` is an older config format, no longer read "
            "(today's configs hold the architecture in a top-level `arch:` section)",
        ),
        ("optim", "model.optim is now optim; give it under that name"),
    ],
)
def test_a_recipe_of_the_older_layout_is_refused_in_one_line(tmp_path, section, message):
    """A recipe written while the architecture was `model.model`, or the optimiser `model.optim`."""
    import yaml

    from pipeline.experiments import spec

    recipe = yaml.safe_load((spec.REPO / "configs" / "recipes" / "cpu-tiny.yaml").read_text())
    recipe["model"] = {{"arch": "model"}.get(section, section): recipe.pop(section)}
    old = tmp_path / "old-recipe.yaml"
    old.write_text(yaml.safe_dump(recipe))
    path = tmp_path / "demo.yaml"
    path.write_text(
        "name: demo\ntitle: Demo\npaper_ref: x\n"
        f"scale: {{paper: {{recipe: {old}}}, cpu: {{recipe: {old}}}}}\n"
        "columns: [{key: sink1, metric: sink/sink1, label: s}]\n"
        "variants: [{name: a, overrides: {arch.n_heads: 4}, paper: {sink1: 1.0}}]\n"
    )
    e = load_experiment(path)
    with pytest.raises(ExperimentError) as err:
        variant_config(e, e.variant("a"), "cpu")
    assert str(err.value) == f"{old}: {message}"
