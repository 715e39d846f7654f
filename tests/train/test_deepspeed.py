"""DeepSpeed on CPU: what can be run for real without CUDA.

Lightning refuses DeepSpeed without CUDA, so (1) the strategy and its config are assembled by
the real CLI and checked, and (2) ZeRO-2 and ZeRO-3 checkpoints are written by DeepSpeed itself (CPU
accelerator, gloo, 2 processes), consolidated with DeepSpeed's own zero_to_fp32 by
`sinklab consolidate`, then loaded, resumed from and exported to Hugging Face format."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, fit_in_process, losses

from data_prep.dataset import PackedSplit
from pipeline.model import load_pretrained
from pipeline.train.cli import SinkLabCLI
from pipeline.train.data import GlobalOrder, SinkDataModule
from pipeline.train.module import SinkLabModule
from pipeline.train.rundir import release_lock


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_strategy_is_assembled_from_the_paper_recipe(stage, tiny_ds, tmp_path, monkeypatch, mlflow_server):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.chdir(REPO)
    cli = SinkLabCLI(SinkLabModule, SinkDataModule, run=False, save_config_callback=None,
                     auto_configure_optimizers=False, args=[
                         "--config", "configs/recipes/paper-60m.yaml", "--data.path", str(tiny_ds),
                         "--run-dir", str(tmp_path / "ds"), "--trainer.accelerator", "cpu", "--trainer.devices", "1",
                         "--model.model.max_seq_len", "64", "--data.global_batch_tokens", "128",
                         "--data.micro_batch_size", "2",
                         "--trainer.strategy.init_args.config", f"configs/deepspeed/zero{stage}.json"])
    try:
        strategy = cli.trainer.strategy
        assert type(strategy).__name__ == "DeepSpeedStrategy"
        strategy.connect(cli.model)
        cli.model.trainer = cli.trainer
        strategy._format_config()
        cfg = strategy.config
        assert cfg["zero_optimization"]["stage"] == stage
        assert cfg["train_micro_batch_size_per_gpu"] == 2
        assert cfg["gradient_accumulation_steps"] == 4 == cli.trainer.accumulate_grad_batches  # 8 seqs / 2
        assert cfg["gradient_clipping"] == 1.0
        assert cfg["bf16"]["enabled"] is True
        assert cli.trainer.max_steps == 20000 and cli.model.optim.lr == 4e-4 and cli.model.optim.weight_decay == 0.1
        assert strategy.zero_stage_3 == (stage == 3)
    finally:
        release_lock(cli.run)


ZERO_FILES = {
    2: ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt"],
    3: ["zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"],
}


def consolidated_zero_checkpoint(stage: int, dataset: Path, tmp_path: Path) -> Path:
    """DeepSpeed writes a ZeRO checkpoint (2 processes, gloo); `sinklab consolidate` merges it
    into an fp32 file whose weights equal the ones DeepSpeed trained."""
    ckpt = tmp_path / f"zero{stage}"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("ds_zero_worker.py")), str(dataset), str(ckpt),
                          str(stage), str(29500 + os.getpid() % 1000)], env=env, capture_output=True, text=True,
                         timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "deepspeed_shm_comm" not in out.stdout + out.stderr  # no op build
    assert sorted(p.name for p in (ckpt / "checkpoint").iterdir()) == ZERO_FILES[stage]

    from pipeline.train.consolidate import main as consolidate

    fp32 = tmp_path / "consolidated.ckpt"
    assert consolidate([str(ckpt), str(fp32)]) == 0
    blob = torch.load(fp32, weights_only=False)
    reference = torch.load(ckpt / "reference_state.pt")
    assert blob["state_dict"].keys() == reference.keys()
    assert all(torch.equal(blob["state_dict"][k], reference[k]) for k in reference)
    assert blob["sinklab"]["optimizer_moments"] == "reset"
    assert blob["global_step"] == 3
    return fp32


def test_zero3_checkpoint_with_partitioned_parameters_consolidates(tiny_ds, tmp_path):
    consolidated_zero_checkpoint(3, tiny_ds, tmp_path)


def test_zero_checkpoint_consolidates_loads_resumes_and_exports(tiny_ds, tmp_path, monkeypatch, mlflow_server):
    fp32 = consolidated_zero_checkpoint(2, tiny_ds, tmp_path)
    reference = torch.load(tmp_path / "zero2" / "reference_state.pt")

    model = load_pretrained(fp32)  # SinkLab loads it
    assert torch.equal(model.lm_head.weight, reference["model.lm_head.weight"])

    from pipeline.model.hf_export import main as export_hf
    from transformers import AutoModelForCausalLM

    hf_dir = tmp_path / "hf"
    assert export_hf([str(fp32), "--out", str(hf_dir)]) == 0
    hf = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    tokens = torch.as_tensor(PackedSplit(tiny_ds, "val").take([0, 1]))
    with torch.no_grad():
        assert torch.allclose(hf(tokens).logits, model.eval()(tokens).logits, atol=1e-4)

    run_dir = tmp_path / "resumed"  # SinkLab resumes from it (weights, schedule; fresh AdamW moments)
    assert fit_in_process(["--data.path", str(tiny_ds), "--run-dir", str(run_dir), "--resume", str(fp32),
                           "--trainer.max_steps", "6", "--run.sink_every", "0", "--run.val_every", "100"],
                          monkeypatch, mlflow_server) == 0
    order = GlobalOrder(64, seed=1234)
    split = PackedSplit(tiny_ds, "train")
    first = torch.as_tensor(np.stack([split[order.lookup(g)[1]] for g in range(8)]))
    module = SinkLabModule(model.config)
    module.model = model.train()
    with torch.no_grad():
        expected = (module.lm_loss(first[:4]) + module.lm_loss(first[4:])) / 2
    assert losses(run_dir)[0] == pytest.approx(float(expected), abs=1e-6)
