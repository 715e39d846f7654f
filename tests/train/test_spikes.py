"""The spike guard (run.skip_spikes): a poisoned batch's step is not applied, a normal run
skips nothing, and the rolling window travels in the checkpoint (a resume skips the same step)."""

from __future__ import annotations

import shutil

import pytest
import torch
from fit_runs import checkpoints_only, fit_in_process, losses, paths, read_metrics

from pipeline.model.config import ConfigError
from pipeline.train.module import SinkLabModule
from pipeline.train.run_options import RunOptions
from pipeline.train.spikes import SpikeGuard

POISONED = 26
ARGS = [
    "--trainer.max_steps",
    "30",
    "--run.skip_spikes",
    "true",
    "--run.spike_window",
    "32",
    *checkpoints_only(24),
]


def test_the_guard_waits_for_history_and_skips_a_rise_only():
    guard = SpikeGuard(window=32, sigmas=6.0)
    noise = [1.0 + 0.01 * ((i * 7) % 5 - 2) for i in range(40)]
    assert not any(guard.check(s, v, 1.0 + v) for s, v in enumerate(noise[:19]))
    assert not guard.check(19, 50.0, 1.0)  # 19 steps of history: too few for a verdict
    fresh = SpikeGuard(window=32, sigmas=6.0)
    for s, v in enumerate(noise[:30]):
        fresh.check(s, v, 2.0 + 0.1 * v)
    state = fresh.state_dict()
    assert fresh.check(30, 1.5, 2.1) and not fresh.check(31, 0.5, 2.1)  # a rise is a spike, a drop is not
    assert fresh.check(32, 1.0, 40.0)  # the gradient norm alone
    assert fresh.skipped == [30, 32] and len(fresh.losses) == 32  # every step enters the window, trimmed to it
    again = SpikeGuard(window=32, sigmas=6.0)
    again.load_state_dict(state)
    assert again.check(30, 1.5, 2.1) and again.skipped == [30] and again.losses[:30] == state["losses"]


def test_a_window_the_run_never_fills_is_refused_at_the_start():
    """`--run.skip_spikes true --run.spike_window 1000` on a 30-step run reported "skipped 0 steps":
    no verdict comes before 500 steps of history, so the guard guarded nothing."""
    options = RunOptions(skip_spikes=True, spike_window=1000)
    with pytest.raises(ConfigError, match=r"no verdict before 500 steps .* trainer.max_steps=30 ends sooner"):
        options.spike_guard(None, 30)
    assert options.spike_guard(None, 501).needed == 500
    with pytest.raises(ConfigError, match="give a run.spike_window of at most 59, or run.skip_spikes false"):
        RunOptions(skip_spikes=True, spike_window=60).spike_guard(None, 30)
    assert RunOptions(skip_spikes=True, spike_window=59).spike_guard(None, 30).needed == 29
    with pytest.raises(
        ConfigError, match="max_steps=12 ends sooner, so it would guard nothing; give more than 20 steps"
    ):
        RunOptions(skip_spikes=True, spike_window=32).spike_guard(None, 12)
    with pytest.raises(ConfigError, match="run.spike_window=10, .* need a window of 20 steps or more"):
        RunOptions(skip_spikes=True, spike_window=10).validate()  # its history never holds 20 steps


@pytest.fixture
def poisoned(monkeypatch):
    """Step 26's batch is poisoned: its loss (and so its gradients) multiplied by 1000."""
    lm_loss = SinkLabModule.lm_loss

    def spiked(self, tokens):
        loss = lm_loss(self, tokens)
        return loss * 1000.0 if self.training and self.global_step == POISONED else loss

    monkeypatch.setattr(SinkLabModule, "lm_loss", spiked)


def adam_steps(ckpt) -> set[float]:
    state = torch.load(ckpt, weights_only=False)["optimizer_states"][0]["state"]
    return {float(s["step"]) for s in state.values()}


def test_a_normal_run_skips_nothing(tiny_ds, tmp_path, monkeypatch, mlflow_server):
    run_dir = tmp_path / "normal"
    assert fit_in_process([*paths(tiny_ds, run_dir), *ARGS], monkeypatch, mlflow_server) == 0
    skipped = [r["train/skipped_steps"] for r in read_metrics(run_dir) if "train/skipped_steps" in r]
    assert len(skipped) == 30 and set(skipped) == {0.0}
    assert adam_steps(run_dir / "checkpoints" / "step-000030.ckpt") == {30.0}


def test_a_poisoned_batch_is_skipped_and_a_resume_skips_it_too(
    poisoned, tiny_ds, tmp_path, monkeypatch, mlflow_server, capsys
):
    data = ["--data.path", str(tiny_ds)]
    ref = tmp_path / "reference"
    assert fit_in_process([*data, "--run-dir", str(ref), *ARGS], monkeypatch, mlflow_server) == 0
    out = capsys.readouterr().out
    assert f"skipped      1 steps (loss or grad norm > 6σ above the last 32 steps): {POISONED}" in out
    rows = {r["step"]: r for r in read_metrics(ref) if "train/skipped_steps" in r}
    assert [s for s in sorted(rows) if rows[s]["train/skipped_steps"] == 1][0] == POISONED
    assert rows[POISONED]["train/grad_norm"] > 100 * rows[POISONED - 1]["train/grad_norm"]
    assert adam_steps(ref / "checkpoints" / "step-000030.ckpt") == {29.0}  # one update not applied
    assert all(v == v and v < 10 for s, v in losses(ref).items() if s != POISONED)  # training went on unharmed

    resumed = tmp_path / "resumed"  # from step 24: the window (24 steps) must come back to catch step 26
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copy(ref / "checkpoints" / "step-000024.ckpt", resumed / "checkpoints")
    assert (
        fit_in_process([*data, "--run-dir", str(resumed), "--resume", "auto", *ARGS], monkeypatch, mlflow_server) == 0
    )
    assert losses(resumed) == {s: v for s, v in losses(ref).items() if s >= 24}
    a, b = (torch.load(d / "checkpoints" / "step-000030.ckpt", weights_only=False) for d in (ref, resumed))
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    assert a["spike_guard"] == b["spike_guard"] and a["spike_guard"]["skipped"] == [POISONED]
