"""`sinklab survey` on the two shipped GGUF models (values recomputed from HF's own eager maps),
on a tiny HF model and a SinkLab checkpoint in one run logged to a real MLflow server, and its
refusals."""

import csv
import json
from dataclasses import replace

import pytest
import torch
from analysis_helpers import micro_model

from pipeline import metrics
from pipeline.analysis import analyze, inputs, survey


def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _eager_alpha1_and_ratio(model, tokens):
    """α_1 [N, L, H] from HF eager attention, and the first-token norm ratio of every block
    output but the last (HF puts the final norm on that one), mean over sequences."""
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(input_ids=tokens, output_attentions=True, output_hidden_states=True, use_cache=False)
    alpha = torch.stack([a[..., :, 0].mean(-1) for a in out.attentions], dim=1)
    norms = [h.norm(dim=-1) for h in out.hidden_states[1:-1]]
    ratios = [float((n[:, 0] / n[:, 1:].mean(-1)).mean()) for n in norms]
    return alpha, ratios


def test_survey_gguf_models_against_eager_attention(smollm2, tmp_path, capsys):
    out = tmp_path / "survey"
    assert (
        survey.main(
            [
                "smollm2",
                "gemma3-270m",
                "-n",
                "2",
                "-T",
                "64",
                "--eps-sweep",
                "0.1,0.5",
                "--out",
                str(out),
                "--no-mlflow",
            ]
        )
        == 0
    )
    rows = {r["model"]: r for r in _read_csv(out / "survey.csv")}
    assert set(rows) == {"smollm2", "gemma3-270m"}
    assert (rows["smollm2"]["layers"], rows["smollm2"]["heads"]) == ("30", "9")
    assert (rows["gemma3-270m"]["layers"], rows["gemma3-270m"]["heads"]) == ("18", "4")
    sweep = _read_csv(out / "sweep.csv")
    assert {float(r["eps"]) for r in sweep} == {0.1, 0.3, 0.5} and len(sweep) == 2 * 6 * 3
    # smollm2, natural text with and without BOS, recomputed from the same tokens
    probe = analyze.check_args(analyze.build_parser().parse_args(["smollm2", "-n", "2", "-T", "64"]))
    for bos, column in ((False, "natural"), (True, "natural_bos")):
        tokens = inputs.probe_sets(smollm2, replace(probe, bos=bos))["natural"]
        alpha, ratios = _eager_alpha1_and_ratio(smollm2.model, tokens)
        assert float(rows["smollm2"][f"sink1_{column}"]) == pytest.approx(metrics.sink_rate(alpha, 0.3))
        curve = {
            float(r["eps"]): float(r["sink1"])
            for r in sweep
            if r["model"] == "smollm2" and r["input"] == "natural" and r["bos"] == str(int(bos))
        }
        assert curve == pytest.approx({e: metrics.sink_rate(alpha, e) for e in (0.1, 0.3, 0.5)})
        suffix = "_bos" if bos else ""
        layer = int(rows["smollm2"][f"norm_ratio{suffix}_layer"])
        if layer < 30:  # the peak is in a block whose output HF returns untouched
            assert float(rows["smollm2"][f"norm_ratio{suffix}"]) == pytest.approx(max(ratios), rel=1e-4)
            assert layer == 1 + ratios.index(max(ratios))
    assert 0.0 <= float(rows["gemma3-270m"]["dormant_pct"]) <= 100.0
    assert (out / "survey.png").read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "| model | L×H | natural | random | repeat | natural +BOS | random +BOS | repeat +BOS |" in printed
    assert (out / "survey.md").read_text().strip() in printed


def test_survey_hf_and_sinklab_models_logged_as_one_run(tiny_llama_dir, tmp_path, mlflow_server):
    import mlflow

    from pipeline.model import save_pretrained

    ckpt_dir = save_pretrained(micro_model(), tmp_path / "ckpt")
    out = tmp_path / "survey"
    assert (
        survey.main(
            [
                str(tiny_llama_dir),
                str(ckpt_dir),
                "--inputs",
                "random,repeat",
                "-n",
                "3",
                "-T",
                "12",
                "--out",
                str(out),
                "--mlflow-uri",
                mlflow_server,
                "--experiment",
                "survey-test",
            ]
        )
        == 0
    )
    saved = json.loads((out / "survey.json").read_text())
    names = [m["model"] for m in saved["models"]]
    # neither tokenizer has a BOS token: those cells are n/a, and said why
    assert all(m["skipped"] == ["BOS: the model's tokenizer has no BOS token"] for m in saved["models"])
    assert "n/a" in (out / "survey.md").read_text()
    client = mlflow.MlflowClient(tracking_uri=mlflow_server)
    run = client.get_run(saved["mlflow_run_id"])
    assert run.data.tags["sinklab.kind"] == "analysis-survey" and run.data.params["num_sequences"] == "3"
    for name, row in zip(names, saved["table"]):
        assert run.data.metrics[f"{name}/sink1_random"] == pytest.approx(row["sink1_random"])
        assert f"{name}/sink1_random_bos" not in run.data.metrics
    curve = client.get_metric_history(run.info.run_id, f"{names[1]}/sweep_repeat")
    assert sorted(m.step for m in curve) == [5, 10, 20, 30, 40, 50, 60, 70, 80, 90]
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {
        "survey.csv",
        "survey.md",
        "survey.png",
        "sweep.csv",
    }


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--bos", "maybe"], r"--bos 'maybe': choose from no,yes"),
        (["--eps-sweep", "0.2,x"], r"--eps-sweep 'x': not a number"),
        (["--eps", "1.5"], r"every ε must lie in \[0, 1\)"),
        (["-T", "300"], r"sinklab survey: -T 300: .* at most 256 positions"),
    ],
)
def test_survey_refusals(tiny_llama_dir, tmp_path, argv, message):
    with pytest.raises(SystemExit, match=message):
        survey.main([str(tiny_llama_dir), "-n", "2", "--out", str(tmp_path / "o"), "--no-mlflow", *argv])
    assert not (tmp_path / "o").exists()


def test_survey_never_writes_over_a_users_file(tiny_llama_dir, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "survey.md").write_text("my table")
    with pytest.raises(SystemExit, match="o: already holds survey.md, which sinklab did not write"):
        survey.main([str(tiny_llama_dir), "-n", "2", "--out", str(out), "--no-mlflow"])
    assert [p.name for p in out.iterdir()] == ["survey.md"] and (out / "survey.md").read_text() == "my table"
