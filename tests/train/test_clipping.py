"""Gradient clipping with a fused AdamW under bf16-mixed (the gpu-small recipe's combination)."""
from __future__ import annotations

import torch
from conftest import fit_in_process, losses

from pipeline.train import module as module_mod


def test_fused_adamw_under_bf16_mixed_clips_every_step(tiny_ds, tmp_path, monkeypatch):
    """Lightning's bf16-mixed plugin refuses gradient_clip_val with a fused optimizer (a check
    meant for fp16's loss scaler). The norms are read after each optimizer step, where the
    gradients the update used are still in place."""
    max_norm, after_clip, fused = 1e-3, [], []
    real_build = module_mod.build_optimizer

    def recording_build(model, cfg):
        optimizer = real_build(model, cfg)
        fused.append(optimizer.defaults["fused"])
        params = [p for group in optimizer.param_groups for p in group["params"]]
        optimizer.register_step_post_hook(lambda *_: after_clip.append(
            float(torch.linalg.vector_norm(torch.stack([p.grad.float().norm() for p in params])))))
        return optimizer

    monkeypatch.setattr(module_mod, "build_optimizer", recording_build)
    run_dir = tmp_path / "run"
    rc = fit_in_process(["--data.path", str(tiny_ds), "--run-dir", str(run_dir), "--trainer.max_steps", "3",
                         "--trainer.precision", "bf16-mixed", "--model.optim.fused", "true",
                         "--trainer.gradient_clip_val", str(max_norm), "--run.sink_every", "0",
                         "--run.val_every", "0", "--run.log_model", "false", "--run.system_metrics", "false"],
                        monkeypatch, f"sqlite:///{tmp_path}/mlflow.db")
    assert rc == 0
    assert fused == [True] and len(after_clip) == 3
    # a fresh model's gradient norm is of order 1, so each of these was clipped to max_norm
    assert all(0 < norm <= max_norm * 1.001 for norm in after_clip), after_clip
    assert sorted(losses(run_dir)) == [0, 1, 2]
