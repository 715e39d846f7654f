"""SinkLab's MLflow view without a server: which metrics reach MLflow, the chart list,
the runs-table columns, and the names runs and datasets carry."""

from __future__ import annotations

import json
from types import SimpleNamespace

from pipeline.tracking import views
from pipeline.tracking.runs import run_scale


def test_per_head_scalars_stay_out_of_mlflow_metrics():
    assert not views.sent_to_mlflow("heads/alpha1_l3_h7") and not views.sent_to_mlflow("heads/entropy_l0_h0")
    assert not views.sent_to_mlflow("heads/out_norm_l9_h1") and not views.sent_to_mlflow("heads/max_logit_l0_h2")
    for name in ("sink/sink1", "heads/dormant_pct", "act/massive_ratio_l0", "val/loss", "attn/max_logit_l0"):
        assert views.sent_to_mlflow(name)


def test_the_chart_list_puts_the_headline_first_and_hides_flat_series():
    cards = views.chart_cards()
    assert [c.get("metricKey") or c["imageKeys"][0] for c in cards[:9]] == [
        *views.HEADLINE,
        "attn/max_logit",
        "train/skipped_steps",
        views.MAX_LOGIT_IMAGE,
        views.ALPHA1_IMAGE,
        views.TRAJECTORY_IMAGE,
    ]
    assert not any(c["deleted"] for c in cards[:9])
    hidden = {c["metricKey"] for c in cards if c["deleted"]}
    assert hidden == {
        "sink/alpha1_uniform",
        "sink/emerged_step_sink1_1pct",
        "sink/emerged_step_sink1_10pct",
        "sink/emerged_step_alpha1_125pct",
        "sink/sink_k1",
    }
    sections = views.sections()
    assert [s["display"] for s in sections[:4]] == [True, True, True, False]  # everything below collapsed
    assert {c["metricSectionId"] for c in cards[:4]} == {sections[0]["uuid"]}
    assert len({s["uuid"] for s in sections}) == len(sections)
    json.dumps(views.view_state([]))  # the tag's value is plain JSON


def test_the_table_shows_the_factors_that_differ_between_runs():
    softmax = {
        "arch.attention.op": "softmax",
        "optim.weight_decay": "0.1",
        "run.name": "a",
        "data.path": "/x",
        "arch.positional": "rope",
    }
    sigmoid = {**softmax, "arch.attention.op": "sigmoid", "run.name": "b", "data.path": "/y"}
    assert views.varied_factors([softmax, sigmoid]) == ["arch.attention.op"]  # run names, paths: no factor
    assert views.varied_factors([softmax]) == list(views.DEFAULT_FACTORS)
    columns = views.table_columns(["arch.attention.op"])
    assert columns[:3] == ["tags.`sinklab.variant`", "tags.`sinklab.seed`", "params.`arch.attention.op`"]
    assert columns[3:6] == ["metrics.`sink/sink1`", "metrics.`sink/alpha1_mean`", "metrics.`val/loss`"]


def test_runs_are_grouped_by_variant_where_a_variant_has_several_seeds():
    one = [{"run.variant": "a", "seed_everything": "1234"}, {"run.variant": "b", "seed_everything": "1234"}]
    two = one + [{"run.variant": "a", "seed_everything": "1235"}]
    assert not views.seeded(one) and views.seeded(two)
    assert not views.seeded([{"run.variant": "", "seed_everything": s} for s in ("1", "2")])  # plain fits
    assert views.view_state([])["groupBy"] is None
    assert views.view_state([], seeded=True)["groupBy"] == {
        "aggregateFunction": "average",
        "groupByKeys": [{"mode": "tag", "groupByData": "sinklab.variant"}],
    }


def test_sweep_run_names_lead_with_the_variant_and_keep_their_scale():
    from pipeline.experiments.configs import run_name

    name = run_name(SimpleNamespace(name="weight-decay"), SimpleNamespace(name="wd-0.0"), "cpu", 1235)
    assert name == "wd-0.0 s1235 (weight-decay/cpu)"
    assert run_scale(name) == "cpu" and run_scale("weight-decay/gpu/wd-0.0") is None  # one format only


def test_the_dataset_is_named_from_its_manifest(tmp_path):
    from packed_datasets import make_dataset

    from data_prep.dataset import load_manifest

    manifest = load_manifest(make_dataset(tmp_path / "folder-name"))
    assert views.dataset_name(manifest) == f"synthetic · C16 · {manifest.hash[:8]}"


def test_the_variant_tag_names_the_attention_op_even_the_default():
    from pipeline.train.fit_config import variant_summary as _variant_summary

    softmax = {"arch": {"preset": "micro"}, "optim": {"lr": 0.002, "weight_decay": 0.5}}
    assert _variant_summary(softmax) == "softmax, lr=0.002, wd=0.5"
    kernel_op = {
        "arch": {"attention": {"op": "kernel", "feature_map": "elu1"}},
        "optim": {"lr": 0.002, "weight_decay": 0.1},
    }
    assert _variant_summary(kernel_op) == "kernel(elu1), lr=0.002, wd=0.1"
