"""The GPU recipes' settings, on a CPU: a fused AdamW clipped under bf16-mixed; torch.compile with
its eager fallback."""

from __future__ import annotations

import pytest
import torch
from fit_runs import fit_in_process, lean_tracking, losses, paths

from pipeline.train import module as module_mod


def test_fused_adamw_under_bf16_mixed_clips_every_step(tiny_ds, tmp_path, monkeypatch):
    """Lightning's bf16-mixed plugin refuses gradient_clip_val with a fused optimizer (a check
    meant for fp16's loss scaler). The norms are read after each optimizer step, where the
    gradients the update used are still in place."""
    max_norm, after_clip, fused = 1e-3, [], []
    real_build = module_mod.build_optimizer

    def counting_build(model, cfg):
        optimizer = real_build(model, cfg)
        fused.append(optimizer.defaults["fused"])
        params = [p for group in optimizer.param_groups for p in group["params"]]
        optimizer.register_step_post_hook(
            lambda *_: after_clip.append(
                float(torch.linalg.vector_norm(torch.stack([p.grad.float().norm() for p in params])))
            )
        )
        return optimizer

    monkeypatch.setattr(module_mod, "build_optimizer", counting_build)
    run_dir = tmp_path / "run"
    rc = fit_in_process(
        [
            *paths(tiny_ds, run_dir),
            "--trainer.max_steps",
            "3",
            "--trainer.precision",
            "bf16-mixed",
            "--optim.fused",
            "true",
            "--trainer.gradient_clip_val",
            str(max_norm),
            "--run.sink_every",
            "0",
            "--run.val_every",
            "0",
            *lean_tracking(),
        ],
        monkeypatch,
        f"sqlite:///{tmp_path}/mlflow.db",
    )
    assert rc == 0
    assert fused == [True] and len(after_clip) == 3
    # a fresh model's gradient norm is of order 1, so each of these was clipped to max_norm
    assert all(0 < norm <= max_norm * 1.001 for norm in after_clip), after_clip
    assert sorted(losses(run_dir)) == [0, 1, 2]


def test_a_compiler_failure_trains_eager_and_says_so_once(tiny_ds, tmp_path, monkeypatch, capsys):
    """Inductor failing (here: made to raise, as a node without a C++ compiler would) costs the
    run its speed, not its life: one warning line naming the way out, every step trained. It
    fails on the backward graph, the harder case: AOTAutograd would compile that only at the
    first backward, outside the forward call where the failure is caught; it is asked to
    compile it at the forward call."""
    import torch._inductor.compile_fx as compile_fx

    real = compile_fx._compile_fx_inner

    def no_compiler(*args, **kwargs):
        if kwargs.get("is_backward"):
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")
        return real(*args, **kwargs)

    monkeypatch.setattr(compile_fx, "_compile_fx_inner", no_compiler)
    torch._dynamo.reset()
    run_dir = tmp_path / "run"
    # the compile caches would skip the compiler
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        rc = fit_in_process(
            [
                *paths(tiny_ds, run_dir),
                "--trainer.max_steps",
                "3",
                "--model.compile",
                "true",
                "--run.sink_every",
                "0",
                *lean_tracking(),
            ],
            monkeypatch,
            f"sqlite:///{tmp_path}/mlflow.db",
        )
    assert rc == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "torch.compile failed" in line]
    assert len(warnings) == 1, warnings
    assert "No working C++ compiler found" in warnings[0] and "--model.compile false" in warnings[0]
    assert sorted(losses(run_dir)) == [0, 1, 2]


def test_the_sink_probe_of_a_compiled_model_compiles_nothing_more():
    """The probe asks for attention weights (another graph per probe shape); it runs eager."""
    from torch._dynamo.utils import counters

    from pipeline import probe
    from pipeline.model import ModelConfig, Transformer
    from pipeline.train.compiling import compile_blocks, uncompiled

    torch._dynamo.reset()
    model = Transformer(ModelConfig.from_preset("micro", vocab_size=64))
    compile_blocks(model.blocks, on_failure=lambda exc: pytest.fail(f"compile failed: {exc}"))
    model(torch.randint(0, 64, (2, 16))).logits.sum().backward()
    compiled = counters["stats"]["unique_graphs"]
    assert compiled > 0
    with uncompiled():
        measures = probe.run_probe(model, torch.randint(0, 64, (4, 12)))
    assert counters["stats"]["unique_graphs"] == compiled and 0 <= measures.sink1 <= 100
