"""`sinklab analyze`'s secondary-sink section: batches add up to one pass over every sequence, for
SinkLab and HF models; the JSON, metrics and figure of a whole analysis."""

import json
from types import SimpleNamespace

import pytest
import torch
from analysis_helpers import HAMLET, micro_model

from pipeline import metric_names as N
from pipeline.analysis import analyze, inputs, secondary
from pipeline.analysis.subject import Subject
from pipeline.secondary_sinks import MIN_QUERIES, layer_stats


def _probe(eps: float) -> analyze.Analysis:
    return analyze.check_args(analyze.build_parser().parse_args(["micro", "--eps", str(eps), "--batch-size", "4"]))


def _in_one_pass(subject, tokens, eps):
    maps, states = secondary.maps_and_states(subject, tokens)
    return [layer_stats(a, eps, 1, MIN_QUERIES, tokens, h) for a, h in zip(maps, states)]


@pytest.mark.parametrize("eps", [0.05, 0.3])
def test_sinklab_batches_add_up_to_one_pass(tmp_path, eps):
    subject = SimpleNamespace(kind="sinklab", model=micro_model(sink_tokens=1), tokenizer=None)
    tokens = torch.randint(0, 64, (6, 24), generator=torch.Generator().manual_seed(0))
    section = secondary.secondary_section(subject, tokens, _probe(eps), tmp_path, "micro")
    whole = _in_one_pass(subject, tokens, eps)
    assert section["count"] == pytest.approx([s.count for s in whole])
    assert section["share"] == pytest.approx([s.share for s in whole])
    assert section["norm_ratio"] == pytest.approx([s.norm_ratio for s in whole])
    assert sum(section["tokens"].values()) <= sum(sum(s.tokens.values()) for s in whole)
    assert (tmp_path / secondary.FIGURE).exists()
    assert section["metrics"][N.layer(N.SECONDARY_COUNT, 0)] == section["count"][0]


def test_hf_model_through_analyze_and_mlflow(tiny_llama_dir, tmp_path, mlflow_server):
    import mlflow

    out = tmp_path / "a"
    argv = [str(tiny_llama_dir), "--inputs", "natural,random", "-n", "3", "-T", "32", "--eps", "0.05"]
    logging = ["--mlflow-uri", mlflow_server, "--experiment", "analysis-secondary-test"]
    assert analyze.main([*argv, "--text", str(HAMLET), "--out", str(out), *logging]) == 0
    report = json.loads((out / "measures.json").read_text())
    rec = report["secondary_sinks"]
    client = mlflow.MlflowClient(tracking_uri=mlflow_server)
    run = client.get_run(report["mlflow_run_id"])
    assert run.data.metrics["sink/secondary_share_l1"] == pytest.approx(rec["share"][1])
    assert secondary.FIGURE in {a.path for a in client.list_artifacts(run.info.run_id)}
    subject = Subject(str(tiny_llama_dir), "auto")
    tokens = inputs.natural_tokens(
        subject, analyze.check_args(analyze.build_parser().parse_args([*argv, "--text", str(HAMLET)]))
    )
    whole = _in_one_pass(subject, tokens, 0.05)
    assert rec["count"] == pytest.approx([s.count for s in whole]) and any(c > 0 for c in rec["count"])
    assert set(rec["metrics"]) <= set(analyze.result_metrics(report))


def test_a_probe_too_short_to_judge_reports_not_judged_not_zero(sinklab_ckpt_with_tokenizer, tmp_path, mlflow_server):
    """At T = 8 no key past the first has the 8 queries that judge it: the count and share are null in
    measures.json and NaN in MLflow, and the printed table says why; at T = 9 the second key is judged."""
    import math

    import mlflow

    from pipeline.analysis.tables import format_table

    argv = [str(sinklab_ckpt_with_tokenizer), "--inputs", "natural", "-n", "2", "--no-plots", "--eps", "0.05"]
    logging = ["--mlflow-uri", mlflow_server, "--experiment", "analysis-not-judged"]
    assert analyze.main([*argv, "-T", "8", "--out", str(tmp_path / "t8"), *logging]) == 0
    report = json.loads((tmp_path / "t8" / "measures.json").read_text())
    rec = report["secondary_sinks"]
    assert rec["count"] == rec["share"] == [None, None] and "-T 9 or more judges them" in rec["not_judged"]
    metrics = mlflow.MlflowClient(mlflow_server).get_run(report["mlflow_run_id"]).data.metrics
    assert math.isnan(metrics[N.layer(N.SECONDARY_COUNT, 0)]) and math.isnan(metrics["sink/secondary_share_l1"])
    assert "Secondary sinks: not judged (no key past the first is followed by the 8 queries" in format_table(report)
    judged = analyze.run(
        Subject(str(sinklab_ckpt_with_tokenizer), "auto"),
        analyze.check_args(analyze.build_parser().parse_args([*argv, "-T", "9", "--out", str(tmp_path / "t9")])),
    )["secondary_sinks"]
    assert "not_judged" not in judged and all(c >= 0 for c in judged["count"])
