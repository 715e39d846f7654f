"""The project's tests that a softmax attention sink emerges: `sinklab fit` (in
process) of the seconds-long Bigram-Backcopy recipe, configs/recipes/bb-tiny.yaml (lr 1e-2 held
near-constant for 400 steps), on a BB dataset prepared here.

Thresholds and the margins measured for them (this machine, `sinklab fit --config
configs/recipes/bb-tiny.yaml --seed_everything S`, seeds 1-6, on `sinklab prep bb
--context-length 32 --sequences 4000 --val-sequences 64 --probe-sequences 50 --probe-length
32`; the bb-sink and bb-attention-ops studies of docs/experiments.md), at step 400:

- softmax: Sink_1 98-100 % (threshold >= 50), BOS share of non-trigger queries 0.65-0.84
  (>= 0.45), of trigger queries <= 0.002 (<= 0.05: the active head copies, the dormant one parks
  on BOS), value-norm ratio 0.19-0.34 (<= 0.6: the value-state drain). At step 0: Sink_1 0 %,
  BOS share of other queries 0.103-0.104 and value-norm ratio 0.76-1.10 (> 0.6), so the same
  thresholds fail there (the test checks that they do).
- ReLU attention (Guo et al.): Sink_1 0 % in all six, BOS share of other queries <= 0.001
  (thresholds: Sink_1 <= 5, share <= 0.3).
- sigmoid attention normalised by its sum (the op's default, proxy scores): Sink_1 0 % in all
  six, BOS share of other queries 0.10-0.21 (<= 0.3). Sigmoid without normaliser is not
  tested: its Sink_1 was 0/2/76/0/52/0 % over the six seeds.

The tests run seed 1: about 30 s of CPU for the three fits and the analysis (60-70 s of wall
time on 2 cores at load 7-9; the MLflow server is the session's). With the ops swapped (softmax
expected sinkless, ReLU expected to sink) they fail at the `_sink` / `_no_sink` assertions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fit_runs import REPO, paths, read_metrics

BB_TINY = str(REPO / "configs" / "recipes" / "bb-tiny.yaml")
STEPS = 400
SEED = "1"
SINK1_PRESENT, SINK1_ABSENT = 50.0, 5.0
OTHER_PRESENT, OTHER_ABSENT = 0.45, 0.3


@pytest.fixture(scope="module")
def bb_data(tmp_path_factory) -> Path:
    from data_prep.cli import main

    out = tmp_path_factory.mktemp("bb") / "bb-tiny"
    assert (
        main(
            [
                "bb",
                "--out",
                str(out),
                "--context-length",
                "32",
                "--sequences",
                "4000",
                "--val-sequences",
                "64",
                "--probe-sequences",
                "50",
                "--probe-length",
                "32",
            ]
        )
        == 0
    )
    return out


def _fit(bb_data, run_dir, monkeypatch, uri, *extra: str) -> list[dict]:
    from pipeline.train.cli import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    args = [
        "--config",
        BB_TINY,
        *paths(bb_data, run_dir),
        "--seed_everything",
        SEED,
        "--trainer.max_steps",
        str(STEPS),
        "--run.val_every",
        "0",
        "--run.sink_every",
        "100",
        "--run.checkpoint_every",
        str(STEPS),
        *extra,
    ]
    assert main(args) == 0
    return [row for row in read_metrics(run_dir) if "sink/sink1" in row]


def _sink(row: dict) -> bool:
    """The softmax sink of Guo et al.: most heads park on token 1 (BOS) and the non-trigger
    (dormant) queries put most of their attention there, the trigger (active) ones almost none."""
    return (
        row["sink/sink1"] >= SINK1_PRESENT
        and row["sink/bos_share_other_l0"] >= OTHER_PRESENT
        and row["sink/bos_share_trigger_l0"] <= 0.05
    )


def _no_sink(row: dict) -> bool:
    return row["sink/sink1"] <= SINK1_ABSENT and row["sink/bos_share_other_l0"] <= OTHER_ABSENT


def test_softmax_sink_emerges_with_value_drain_and_analyze_reads_it_back(
    bb_data, tmp_path, monkeypatch, mlflow_server, capsys
):
    run_dir = tmp_path / "softmax"
    probes = _fit(bb_data, run_dir, monkeypatch, mlflow_server)
    first, last = probes[0], probes[-1]
    print("softmax probes:", [(r["step"], r["sink/sink1"], round(r["sink/bos_share_other_l0"], 3)) for r in probes])
    assert first["step"] == 0 and not _sink(first)  # the thresholds fail at initialisation
    assert last["step"] == STEPS and _sink(last)
    assert last["act/value_norm_ratio_l0"] <= 0.6 < first["act/value_norm_ratio_l0"]
    # the joint-dynamics figure, on disk and on the MLflow run
    from mlflow.tracking import MlflowClient

    assert (run_dir / "plots" / "extreme_tokens.png").read_bytes()[:4] == b"\x89PNG"
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    assert "plots/extreme_tokens.png" in {a.path for a in MlflowClient(mlflow_server).list_artifacts(run_id, "plots")}

    # `sinklab analyze` of the final checkpoint on the dataset's probe set: the trigger split comes
    # from the manifest, and every extreme-token number equals the live probe's at that step
    from pipeline.analysis import analyze

    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    out = tmp_path / "analysis"
    ckpt = run_dir / "checkpoints" / f"step-{STEPS:06d}.ckpt"
    assert (
        analyze.main(
            [
                str(ckpt),
                "--dataset",
                str(bb_data),
                "--inputs",
                "natural",
                "-n",
                "50",
                "-T",
                "32",
                "--out",
                str(out),
                "--no-plots",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "Extreme-token phenomena per layer (natural" in printed and "BOS share, other queries" in printed
    header = next(line for line in printed.splitlines() if "Sink_1^ε" in line)
    assert "natural BOS first (the dataset's probe set)" in header  # not "no BOS"
    layers = json.loads((out / "measures.json").read_text())["extreme_tokens"]["natural"]
    for key in (
        "sink/bos_share_trigger_l0",
        "sink/bos_share_other_l0",
        "act/value_norm_ratio_l0",
        "act/massive_ratio_l0",
    ):
        assert layers[key] == pytest.approx(last[key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("op", ["relu", "sigmoid"])
def test_attention_without_softmax_grows_no_sink(op, bb_data, tmp_path, monkeypatch, mlflow_server):
    probes = _fit(bb_data, tmp_path / op, monkeypatch, mlflow_server, "--arch.attention.op", op)
    print(f"{op} probes:", [(r["step"], r["sink/sink1"], round(r["sink/bos_share_other_l0"], 3)) for r in probes])
    assert probes[-1]["step"] == STEPS
    assert all(_no_sink(row) for row in probes)
