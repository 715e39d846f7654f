"""When the sink emerges: the glue of pipeline.train.emergence on hand-made metric
histories, and `sinklab fit` end to end with the elu+1 kernel (metrics, tags, figure, resume)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from fit_runs import fit_in_process, keep_checkpoints, read_metrics
from mlflow.tracking import MlflowClient

from pipeline import metric_names as N
from pipeline import metrics as M
from pipeline.model.config import ModelConfig
from pipeline.train import emergence as E


def _write(path, rows):
    path.write_text("".join(json.dumps({"time": 0.0, **row}) + "\n" for row in rows))


def test_uniform_reference_follows_mask_and_slots():
    cfg = ModelConfig.from_dict({"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ffn": 64, "max_seq_len": 64})
    assert E.probe_uniform_alpha1(cfg, 64) == pytest.approx(sum(1 / i for i in range(1, 65)) / 64)  # H(T) / T
    one_sink = cfg.replace(sink_tokens=1)  # the sink token is one more key every query sees
    assert E.probe_uniform_alpha1(one_sink, 4) == pytest.approx((1 / 2 + 1 / 3 + 1 / 4 + 1 / 5) / 4)
    window = cfg.replace(mask="sliding", window=2)
    assert E.probe_uniform_alpha1(window, 4) == pytest.approx((1 + 1 / 2) / 4)


def test_each_crossing_is_logged_once_at_its_step_across_starts(tmp_path):
    path, u = tmp_path / "metrics.jsonl", 0.1
    alpha1 = torch.tensor([[0.1, 0.2], [0.3, 0.4]])
    # nothing logged yet: a crossing at the very first probe counts
    first = E.step_metrics(alpha1, 2.0, 0.11, 0, path, u)
    assert first["sink/emerged_step_sink1_1pct"] == 0 and "sink/emerged_step_sink1_10pct" not in first
    assert first["heads/alpha1_l1_h0"] == pytest.approx(0.3) and first[N.ALPHA1_UNIFORM] == u
    _write(
        path,
        [
            {"step": 0, "sink/sink1": 0.0, "sink/alpha1_mean": 0.10},
            {"step": 100, "sink/sink1": 1.5, "sink/alpha1_mean": 0.12},
            {"step": 100, "train/loss": 3.0},
            # left by a start killed after step 200's probe, before its checkpoint:
            {"step": 200, "sink/sink1": 50.0, "sink/alpha1_mean": 0.5},
        ],
    )
    # the resumed start probes step 200 again: Sink_1 > 1% was reached at 100 (not again);
    # the stale row at 200 does not count, today's values do
    again = E.step_metrics(alpha1, 5.0, 0.12, 200, path, u)  # 0.12 < 1.25 x 0.1
    assert not E.tags_of(again)
    later = E.step_metrics(alpha1, 12.0, 0.2, 200, path, u)
    assert E.tags_of(later) == {"sink/emerged_step_sink1_10pct": "200", "sink/emerged_step_alpha1_125pct": "200"}
    with open(path, "a") as f:  # logged, then probed again at the same step by a resumed start
        f.write(json.dumps({"step": 200, "sink/sink1": 12.0, "sink/alpha1_mean": 0.2, **later}) + "\n")
    assert not E.tags_of(E.step_metrics(alpha1, 12.0, 0.2, 200, path, u))
    assert E.emerged_so_far(path, 200, 12.0, 0.2, u) == {
        "sink/emerged_step_sink1_1pct": 100,
        "sink/emerged_step_sink1_10pct": 200,
        "sink/emerged_step_alpha1_125pct": 200,
    }


def test_head_trajectories_read_every_start(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _write(
        path,
        [
            {"step": s, **{N.head(N.HEAD_ALPHA1, l, h): s + 10 * l + h for l in range(2) for h in range(3)}}
            for s in (8, 0, 4)
        ],
    )
    steps, series = E.head_trajectories(path, 2, 3)
    assert steps == [0, 4, 8] and series[(1, 2)] == [12, 16, 20] and series[(0, 0)] == [0, 4, 8]
    png = E.draw_trajectory(path, 2, 3, tmp_path / "t.png", 0.07)
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert E.draw_trajectory(tmp_path / "none.jsonl", 2, 3, tmp_path / "n.png") is None


def test_extreme_token_figure_draws_what_was_measured(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    _write(
        path,
        [{"step": s, "sink/sink1": 10.0 * s, "act/massive_ratio_l0": 1.0, "act/massive_ratio_l1": 2.0} for s in (4, 0)]
        + [{"step": 2, "train/loss": 3.0}],
    )
    drawn = {}
    monkeypatch.setattr(
        "pipeline.plots.extreme_token_dynamics",
        lambda steps, panels, out, title: drawn.update(steps=steps, panels=panels) or out,
    )
    E.draw_extreme_tokens(path, 2, tmp_path / "x.png")
    # no trigger split and no value ratio in this history: the attention panel holds Sink_1 only,
    # and there is no value-state panel
    assert drawn["steps"] == [0, 4]
    assert [(title.split(" ")[0], list(lines)) for title, lines in drawn["panels"]] == [
        ("attention", ["Sink₁ / 100"]),
        ("‖h₁‖", ["‖h₁‖ ratio, layer 0", "‖h₁‖ ratio, layer 1"]),
    ]
    assert drawn["panels"][0][1]["Sink₁ / 100"] == [0.0, 0.4]
    assert E.draw_extreme_tokens(tmp_path / "none.jsonl", 2, tmp_path / "n.png") is None


# The elu+1 kernel (the paper's strongest sink), a large learning rate and BOS fixed at position 1
# (the probe carries it too): on the tiny data Sink_1 leaves zero within a few steps.
ELU1 = [
    "--arch.attention.op",
    "kernel",
    "--arch.attention.feature_map",
    "elu1",
    "--optim.lr",
    "0.03",
    "--optim.min_lr",
    "0.003",
    "--data.interventions.fix_position",
    "1",
    "--data.interventions.fix_token",
    "bos",
]


def _emerged(rows):
    return {k: v for row in rows for k, v in row.items() if k.startswith(N.EMERGED_STEP)}


def test_fit_logs_emergence_tags_and_trajectory_and_survives_resume(tiny_ds, tmp_path, monkeypatch, mlflow_server):
    args = [
        "--data.path",
        str(tiny_ds),
        "--trainer.max_steps",
        "8",
        "--run.sink_every",
        "2",
        *keep_checkpoints(4),
        *ELU1,
    ]
    ref_dir = tmp_path / "ref"
    assert fit_in_process([*args, "--run-dir", str(ref_dir)], monkeypatch, mlflow_server) == 0
    rows = read_metrics(ref_dir)
    probes = [r for r in rows if "sink/sink1" in r]
    assert [r["step"] for r in probes] == [0, 2, 4, 6, 8]
    uniform = sum(1 / i for i in range(1, 13)) / 12  # H(T) / T: the tiny probe set, T = 12, causal, no slots
    assert all(r[N.ALPHA1_UNIFORM] == pytest.approx(uniform) for r in probes)
    assert all(
        r["sink/alpha1_mean"]
        == pytest.approx(sum(r[N.head(N.HEAD_ALPHA1, l, h)] for l in range(2) for h in range(2)) / 4, rel=1e-5)
        for r in probes
    )
    expected = M.emergence_steps([(r["step"], r["sink/sink1"], r["sink/alpha1_mean"]) for r in probes], uniform)
    logged = _emerged(rows)
    assert expected["sink1_1pct"] is not None  # a sink does emerge here (alpha_1 need not cross 1.25 x)
    # each crossing once, in the probe row of its step; none for a threshold never crossed
    assert logged == {N.emerged_step(k): float(v) for k, v in expected.items() if v is not None}
    assert sum(k.startswith(N.EMERGED_STEP) for r in rows for k in r) == len(logged)
    client = MlflowClient(mlflow_server)
    run = client.get_run((ref_dir / "mlflow_run_id").read_text().strip())
    for name in (
        N.emerged_step(n) for n in (*M.EMERGENCE_SINK1, *M.EMERGENCE_ALPHA1)
    ):  # metric and tag: both set, the same step, or both absent
        assert run.data.metrics.get(name) == logged.get(name)
        assert run.data.tags.get(name) == (str(int(logged[name])) if name in logged else None)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert "plots/alpha1_trajectory.png" in artifacts and (ref_dir / "plots" / "alpha1_trajectory.png").exists()
    print(
        f"elu+1 tiny run: probes {[(r['step'], round(r['sink/sink1'], 2), round(r['sink/alpha1_mean'], 3)) for r in probes]}"
        f"; uniform {uniform:.3f}; emerged {expected}"
    )

    # A second run directory resumes from the reference's step-4 checkpoint with the history of
    # that first start, plus a stale row a start killed at step 6 would leave: the emergence
    # steps come out the same, each logged once.
    run_dir = tmp_path / "resumed"
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copy(ref_dir / "checkpoints" / "step-000004.ckpt", run_dir / "checkpoints")
    first_start = [r for r in rows if r["step"] <= 4]
    stale = {**probes[3], "sink/sink1": 99.0, "sink/alpha1_mean": 0.99}
    _write(run_dir / "metrics.jsonl", [*first_start, stale])
    assert fit_in_process([*args, "--run-dir", str(run_dir), "--resume", "auto"], monkeypatch, mlflow_server) == 0
    again = read_metrics(run_dir)
    assert _emerged(again) == logged
    assert sum(k.startswith(N.EMERGED_STEP) for r in again for k in r) == len(logged)
