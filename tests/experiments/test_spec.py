"""Experiment files: every file loads, the paper's numbers are the seeds', bad files fail clearly."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from experiment_helpers import load_all

from pipeline.experiments.spec import EXPERIMENTS_DIR, ExperimentError, experiment_files, load_experiment

EXPECTED = {
    "weight-decay",
    "lr-steps",
    "batch-size",
    "data-amount",
    "random-first-tokens",
    "fixed-token-position",
    "prefix-lm",
    "sliding-window",
    "positional-embedding",
    "post-norm",
    "ffn",
    "heads",
    "attention-biases",
    "fixed-v-star",
    "head-sharing-biases",
    "key-bias-dims",
    "softmax-scale",
    "sigmoid-lr-wd",
    "attention-operations",
    "sigmoid-1b",
    "sink-tokens",
    "mitigations",
    "retrofit-sink",
    "retrofit-sink-smollm2",
    # Guo et al.'s Bigram-Backcopy findings
    "bb-sink",
    "bb-attention-ops",
    "bb-optimizers",
    "bb-norm",
    "bb-mitigations",
    # the optimiser and stability
    "optimizers",
    "lr-tolerance",
    # why the first token: context length and length generalisation
    "context-length",
    "length-generalisation",
    "bb-context-length",
    "bb-length-generalisation",
}


def test_every_experiment_of_the_issue_has_a_valid_file():
    experiments = load_all()
    assert {e.name for e in experiments} == EXPECTED
    for e in experiments:
        assert e.variants and e.columns
        assert e.mlflow_experiment == f"sinklab/{e.name}"
        assert e.cpu_notes, f"{e.name}: the cpu scale departs from the paper and must say how"


@pytest.mark.parametrize(
    "name,variant,values",
    [
        # Hand-copied from the seeds; a typo in a file fails here.
        ("weight-decay", "wd-0.5", {"sink1": 41.08, "val_loss": 3.80}),
        ("weight-decay", "wd-5.0", {"sink1": 0.01, "val_loss": 5.24}),
        ("lr-steps", "lr1e-4-80k", {"sink1": 6.29, "val_loss": 3.67}),
        ("batch-size", "bs-2m", {"sink1": 16.19, "val_loss": 3.68}),
        ("fixed-token-position", "fixed-pos2", {"sink1": 0.0, "sink2": 69.03, "sink3": 0.0, "sink4": 0.01}),
        ("random-first-tokens", "random-x1-x2", {"sink1": 1.98, "sink2": 14.08, "val_loss": None}),
        ("positional-embedding", "relative", {"sink1": 35.53, "val_loss": 5.45}),
        ("post-norm", "post-norm", {"sink1": 13.54, "val_loss": None}),
        ("ffn", "reglu", {"sink1": 13.88, "val_loss": 3.75}),
        ("heads", "h8-sum", {"sink1": 21.76, "val_loss": 3.74}),
        ("attention-biases", "kv-biases", {"sink_star": 72.76, "sink1": 0.04, "val_loss": 3.72}),
        ("attention-biases", "v-biases", {"sink_star": None, "sink1": 17.53, "val_loss": 3.73}),
        ("head-sharing-biases", "kv-shared", {"sink_star": 56.61, "sink1": 12.44, "val_loss": 3.72}),
        ("key-bias-dims", "da-1", {"sink_star": None, "sink1": None, "val_loss": None}),
        ("key-bias-dims", "da-32", {"sink_star": 51.23, "sink1": 1.94, "val_loss": 3.73}),
        ("fixed-v-star", "v20-onehot", {"sink_star": None, "sink1": 25.88, "val_loss": None}),
        ("softmax-scale", "alpha-0.05", {"sink1": 4.53, "val_loss": 3.78}),
        ("sigmoid-lr-wd", "lr4e-4-wd1.0", {"sink1": 0.30, "val_loss": 4.06}),
        ("attention-operations", "kernel-elu1-sum", {"sink1": 53.65, "val_loss": 4.19}),
        ("attention-operations", "elu1-sum", {"sink1": None, "val_loss": None}),
        ("sigmoid-1b", "softmax", {"sink1": 45.11, "val_loss": 3.07}),
        ("sink-tokens", "sink-2", {"ppl_1_1023": 25.73, "ppl_0_1024": 1262, "piqa": 64.3}),
        ("data-amount", "data-50m", {"sink1": None, "val_loss": None}),
    ],
)
def test_paper_values_match_the_seeds(name, variant, values):
    v = load_experiment(name).variant(variant)
    for key, expected in values.items():
        assert v.paper[key] == expected, f"{name}/{variant}.{key}"


def test_failed_trainings_of_table_15_are_marked_not_invented():
    e = load_experiment("attention-operations")
    failed = [v.name for v in e.variants if v.paper_status == "training failure"]
    assert failed == ["elu1-sum", "kernel-elu1-none", "kernel-identity-clamp"]
    assert all(all(x is None for x in e.variant(n).paper.values()) for n in failed)


def test_scale_specific_overrides_win_over_shared_ones():
    e = load_experiment("lr-steps")
    v = e.variant("lr1e-4-80k")
    assert e.overrides(v, "paper")["trainer.max_steps"] == 80000
    assert e.overrides(v, "cpu")["trainer.max_steps"] == 4000


def test_a_scale_may_read_a_column_from_another_metric():
    e = load_experiment("sink-tokens")
    ppl = next(c for c in e.columns if c.key == "ppl_1_1023")
    assert e.metric(ppl, "paper") == "stream/ppl_1_1023" and e.metric(ppl, "cpu") == "stream/ppl_1_63"
    sink1 = next(c for c in e.columns if c.key == "sink1")
    assert e.metric(sink1, "cpu") == e.metric(sink1, "paper") == "sink/sink1"


def test_the_gpu_scale_is_opt_in_and_a_missing_one_is_refused_by_name():
    e = load_experiment("weight-decay")
    assert e.setup("gpu").recipe == "configs/recipes/gpu-small.yaml"
    assert e.overrides(e.variant("wd-0.5"), "gpu") == {"optim.weight_decay": 0.5}
    with pytest.raises(ExperimentError, match=r"lr-steps.yaml: scale.gpu: this experiment has no gpu scale"):
        load_experiment("lr-steps").setup("gpu")


def _write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(body))
    return path


GOOD = """\
    name: demo
    title: Demo
    paper_ref: "Gu et al. 2025, Table 0"
    scale:
      paper: {recipe: configs/recipes/paper-60m.yaml}
      cpu: {recipe: configs/recipes/cpu-tiny.yaml}
    columns:
      - {key: sink1, metric: sink/sink1, label: "Sink_1 (%)"}
    variants:
      - name: a
        overrides: {arch.n_heads: 4}
        paper: {sink1: 12.5}
"""


def test_a_good_file_loads(tmp_path):
    e = load_experiment(_write(tmp_path, "demo", GOOD))
    assert e.variant("a").paper == {"sink1": 12.5}
    assert e.group == tmp_path.name
    assert e.setup("cpu").seeds == 1


def test_seeds_are_counted_from_the_recipes_seed(tmp_path):
    from pipeline.experiments.configs import seeds

    text = textwrap.dedent(GOOD).replace("cpu-tiny.yaml}", "cpu-tiny.yaml, seeds: 3}")
    e = load_experiment(_write(tmp_path, "demo", text))
    assert e.setup("cpu").seeds == 3 and e.setup("paper").seeds == 1
    assert seeds(e, "cpu") == [1234, 1235, 1236]  # cpu-tiny.yaml: seed_everything 1234
    assert seeds(e, "cpu", 2) == [1234, 1235] and seeds(e, "paper") == [1234]


@pytest.mark.parametrize(
    "change,message",
    [
        (("paper: {sink1: 12.5}", "paper: {sink1: twelve}"), ":12: variants[0].paper.sink1: expected a number or null"),
        (("paper: {sink1: 12.5}", "paper: {sink9: 1.0}"), ":12: variants[0].paper.sink9: no column 'sink9'"),
        (("name: demo", "name: other"), ":1: name: name 'other' must equal the file name 'demo'"),
        (("  cpu: {recipe: configs/recipes/cpu-tiny.yaml}\n", ""), ":4: scale: missing required field 'cpu'"),
        (
            ("overrides: {arch.n_heads: 4}", "overrides: {arch: {n_heads: 4}}"),
            ":11: variants[0].overrides.arch: override values must be scalars",
        ),
        (("title: Demo", "title: Demo\nsteps: 3"), ":3: steps: unknown field 'steps'"),
        (
            ("cpu-tiny.yaml}", "cpu-tiny.yaml, metrics: {val/loss: val/loss_cpu}}"),
            ":6: scale.cpu.metrics.val/loss: renames 'val/loss', which no column reads",
        ),
        (("cpu-tiny.yaml}", "cpu-tiny.yaml, seeds: 0}"), ":6: scale.cpu.seeds: expected a whole number in 1..1000"),
        (
            ("cpu-tiny.yaml}", "cpu-tiny.yaml, seeds: 99999999999999999999}"),
            ":6: scale.cpu.seeds: expected a whole number in 1..1000, got 99999999999999999999",
        ),
        (
            ("overrides: {arch.n_heads: 4}", "overrides: {arch.n_heads: 4, seed_everything: 2}"),
            ":11: variants[0].overrides.seed_everything: seed_everything is set by the sweep: seeds are an axis",
        ),
        (
            ("cpu-tiny.yaml}", "cpu-tiny.yaml, overrides: {data.seed: 7}}"),
            ":6: scale.cpu.overrides.data.seed: data.seed is set by the sweep",
        ),
        (
            ("overrides: {arch.n_heads: 4}", "overrides: {model.optim.lr: 1.0e-3}"),
            ":11: variants[0].overrides.model.optim.lr: model.optim.lr is now optim.lr; give it under that name",
        ),
        (
            ("overrides: {arch.n_heads: 4}", "overrides: {arch.attention.scale: 0.5}"),
            ":11: variants[0].overrides.arch.attention.scale: arch.attention.scale is now arch.attention.alpha;",
        ),
        (
            ("metric: sink/sink1", "metric: sink1"),
            ":8: columns[0].metric: 'sink1' is not a metric name; SinkLab's start with one of sink/, act/",
        ),
        (
            ('label: "Sink_1 (%)"}', 'label: "Sink_1 (%)", digits: 2.5}'),
            ":8: columns[0].digits: expected a whole number of decimals from 0 to 6, got 2.5",
        ),
    ],
)
def test_bad_files_name_file_line_and_field(tmp_path, change, message):
    path = _write(tmp_path, "demo", textwrap.dedent(GOOD).replace(*change))
    with pytest.raises(ExperimentError) as err:
        load_experiment(path)
    assert str(path) in str(err.value)
    assert message in str(err.value), str(err.value)


def test_unknown_experiment_lists_the_known_ones():
    with pytest.raises(ExperimentError, match="no experiment 'nope'.*weight-decay"):
        load_experiment("nope")


def test_files_live_under_configs_experiments():
    assert all(p.is_relative_to(EXPERIMENTS_DIR) for p in experiment_files())


def test_the_docs_list_every_experiment_with_its_paper_table():
    doc_path = "docs/experiments.md"
    doc = (EXPERIMENTS_DIR.parents[1] / doc_path).read_text()
    for e in load_all():
        row = next((line for line in doc.splitlines() if line.startswith(f"| `{e.group}/{e.name}` |")), None)
        assert row is not None, f"{doc_path} has no row for {e.group}/{e.name}"
        assert e.paper_ref.split()[0] in row  # the first author of the paper it cites


def test_every_gated_variant_names_its_gate():
    """Head-wise, or element-wise (Qiu et al.'s G1): a study's table says which gate it ran."""
    gated = []
    for e in load_all():
        for v in e.variants:
            for scale in e.scales:
                overrides = e.overrides(v, scale)
                if overrides.get("arch.attention.gated"):
                    gated.append(f"{e.name}/{v.name}")
                    assert overrides.get("arch.attention.gate_granularity") in ("headwise", "elementwise"), gated[-1]
    assert "lr-tolerance/gated-elementwise-x4" in gated
