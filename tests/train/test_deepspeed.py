"""DeepSpeed ZeRO through Lightning: the real `sinklab fit` under ZeRO-1, 2 and 3 on CPU, two
processes over gloo, with the recipe's strategy class and the ZeRO JSON files of configs/.

Each stage trains what DDP trains; ZeRO-3 survives SIGUSR1 (stop at a step boundary) and SIGKILL
of the whole process group and resumes bit for bit (ZeRO-2's SIGUSR1 resume: tests/cluster); a
checkpoint `sinklab fit` wrote consolidates, loads and exports to Hugging Face."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from fit_runs import (
    REPO,
    built_fit,
    fit_in_process,
    keep_checkpoints,
    losses,
    paths,
    read_metrics,
    sinklab_process,
    wait_for_step,
)
from lightning.pytorch.strategies import DeepSpeedStrategy as LightningDeepSpeedStrategy
from lightning.pytorch.strategies import StrategyRegistry

from data_prep.dataset import PackedSplit
from pipeline.model import load_pretrained
from pipeline.train.sharding import DeepSpeedStrategy

STEPS = 12
# micro 2 x accum 2 x world 2 = the recipe's 8 sequences. AdamW's eps is raised so that a
# gradient of the wrong magnitude (loss divided by the accumulation twice) changes the losses.
ARGS = [
    "--trainer.max_steps",
    str(STEPS),
    *keep_checkpoints(4),
    "--run.sink_every",
    "4",
    "--data.micro_batch_size",
    "2",
    "--trainer.devices",
    "2",
    "--optim.eps",
    "1e-4",
    "--run.experiment",
    "train-deepspeed",
]


def zero(stage: int) -> list[str]:
    """The strategy as a recipe selects it: the class and one of the ZeRO JSON files."""
    return [
        "--trainer.strategy",
        "pipeline.train.sharding.DeepSpeedStrategy",
        "--trainer.strategy.config",
        str(REPO / "configs" / "deepspeed" / f"zero{stage}.json"),
    ]


def fit(args: list[str], uri: str) -> str:
    proc = sinklab_process([*ARGS, *args], uri)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:]
    return out


@pytest.fixture(scope="module")
def runs(tiny_ds, tmp_path_factory, mlflow_server) -> dict[str, Path]:
    """One uninterrupted run per strategy: DDP and ZeRO-1, 2, 3."""
    root = tmp_path_factory.mktemp("deepspeed")
    out = {}
    for name, strategy in (("ddp", ["--trainer.strategy", "ddp"]), *((f"zero{s}", zero(s)) for s in (1, 2, 3))):
        out[name] = root / name
        log = fit([*paths(tiny_ds, out[name]), *strategy], mlflow_server)
        assert "micro 2 x accum 2 x world 2" in log
    return out


def sink_rows(run_dir: Path) -> dict[int, tuple[float, float]]:
    return {r["step"]: (r["sink/sink1"], r["sink/alpha1_mean"]) for r in read_metrics(run_dir) if "sink/sink1" in r}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_each_zero_stage_trains_what_ddp_trains(stage, runs):
    """fp32 on CPU: the same batches, the same initial weights and the same clipped AdamW update.
    ZeRO only partitions the reductions and the optimizer, which changes float summation order,
    so losses agree to ~1e-6 (observed: bitwise for ZeRO-2); the double loss scaling that
    Lightning's strategy has under accumulation would move them by ~1e-3 here."""
    ddp, ds = runs["ddp"], runs[f"zero{stage}"]
    l_ddp, l_ds = losses(ddp), losses(ds)
    assert sorted(l_ds) == list(range(STEPS))
    assert all(abs(l_ddp[s] - l_ds[s]) < 2e-6 for s in l_ddp), (l_ddp, l_ds)
    # The live probe (under ZeRO-3 every rank joins the parameter gather) sees the same model.
    s_ddp, s_ds = sink_rows(ddp), sink_rows(ds)
    assert sorted(s_ds) == [0, 4, 8, 12]
    assert all(s_ds[k][0] == s_ddp[k][0] and abs(s_ds[k][1] - s_ddp[k][1]) < 1e-5 for k in s_ddp), (s_ddp, s_ds)
    # Step checkpoints are DeepSpeed directories written through Lightning, complete with `latest`.
    ckpts = sorted(p.name for p in (ds / "checkpoints").iterdir())
    assert ckpts == ["step-000004.ckpt", "step-000008.ckpt", "step-000012.ckpt"]
    for name in ckpts:
        ckpt = ds / "checkpoints" / name
        assert ckpt.is_dir() and (ckpt / "latest").read_text().strip() == "checkpoint"
        assert len(list((ckpt / "checkpoint").glob("*optim_states.pt"))) == 2  # one partition per rank


def optimizer_partitions(ckpt: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every rank's ZeRO optimizer partition, by rank file and key path."""
    out = {}

    def walk(value, key):
        if isinstance(value, torch.Tensor):
            out[key] = value
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{key}/{k}")
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(v, f"{key}/{i}")

    for path in sorted((ckpt / "checkpoint").glob("*optim_states.pt")):
        walk(torch.load(path, map_location="cpu", weights_only=False)["optimizer_state_dict"], path.name)
    return out


def test_preempted_then_killed_run_resumes_bit_for_bit(runs, tiny_ds, tmp_path, mlflow_server):
    """ZeRO-3 (the parameters partitioned too). SIGUSR1 to rank 0: every rank stops at the next
    step boundary and checkpoints there. The resumed start is then SIGKILLed as a whole process
    group; `--resume auto` continues from the newest complete checkpoint. Losses, weights and
    every optimizer partition end equal to the uninterrupted run's, bit for bit."""
    run_dir = tmp_path / "interrupted"
    args = [*paths(tiny_ds, run_dir), "--resume", "auto", *zero(3)]

    proc = sinklab_process([*ARGS, *args], mlflow_server)
    wait_for_step(proc, run_dir, 1)
    os.kill(proc.pid, signal.SIGUSR1)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-4000:]
    stopped = int(out.split("stopped by SIGUSR1 at step ")[1].split(",")[0])
    assert 1 <= stopped < STEPS and max(losses(run_dir)) == stopped - 1
    assert (run_dir / "checkpoints" / f"step-{stopped:06d}.ckpt" / "latest").is_file()

    proc = sinklab_process([*ARGS, *args], mlflow_server)
    killed_at = wait_for_step(proc, run_dir, stopped)
    os.killpg(proc.pid, signal.SIGKILL)  # both ranks, mid-run
    proc.communicate()
    assert killed_at < STEPS - 1

    out = fit(args, mlflow_server)
    assert "Restored all states from the checkpoint" in out
    reference = runs["zero3"]
    assert losses(run_dir) == losses(reference)  # later rows (the resumed ones) win
    final = Path("checkpoints") / f"step-{STEPS:06d}.ckpt"
    a, b = optimizer_partitions(reference / final), optimizer_partitions(run_dir / final)
    assert a.keys() == b.keys() and len(a) > 0
    assert all(torch.equal(a[k], b[k]) for k in a)  # fp32 master weights and both AdamW moments


def test_checkpoint_of_fit_consolidates_loads_and_exports(runs, tiny_ds, tmp_path, monkeypatch, mlflow_server):
    """ZeRO-3 (parameters partitioned too) -> `sinklab consolidate` -> the weights DDP trained;
    -> `sinklab export-hf` -> LlamaForCausalLM with the same logits; and `--resume FILE` continues
    from it (fresh AdamW moments) with the reference's loss at that step."""
    from transformers import AutoModelForCausalLM

    from pipeline.export import main as export_hf
    from pipeline.train.consolidate import main as consolidate

    fp32 = tmp_path / "step-000008.ckpt"
    assert consolidate([str(runs["zero3"] / "checkpoints" / "step-000008.ckpt"), str(fp32)]) == 0
    blob = torch.load(fp32, weights_only=False)
    ddp = torch.load(runs["ddp"] / "checkpoints" / "step-000008.ckpt", weights_only=False)["state_dict"]
    assert blob["state_dict"].keys() == ddp.keys()
    assert all(torch.allclose(blob["state_dict"][k], ddp[k], atol=1e-5) for k in ddp)
    assert blob["global_step"] == 8 and blob["sinklab"]["optimizer_moments"] == "reset"

    model = load_pretrained(fp32).eval()
    # The run's MLflow model: the same fp32 weights, merged from the final checkpoint by fit itself
    from pipeline.tracking import resolve_model

    run_id = (runs["zero3"] / "mlflow_run_id").read_text().strip()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    logged = load_pretrained(resolve_model(f"runs:/{run_id}/model").path)
    final = torch.load(runs["ddp"] / "checkpoints" / "step-000012.ckpt", weights_only=False)["state_dict"]
    assert all(torch.allclose(v, final[f"model.{k}"], atol=1e-5) for k, v in logged.state_dict().items())
    hf_dir = tmp_path / "hf"
    assert export_hf([str(fp32), "--out", str(hf_dir)]) == 0
    hf = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    tokens = torch.as_tensor(PackedSplit(tiny_ds, "val").take([0, 1]))
    with torch.no_grad():
        assert torch.allclose(hf(tokens).logits, model(tokens).logits, atol=1e-4)

    run_dir = tmp_path / "resumed"
    assert (
        fit_in_process(
            [
                *paths(tiny_ds, run_dir),
                "--resume",
                str(fp32),
                "--trainer.max_steps",
                "9",
                "--data.micro_batch_size",
                "2",
                "--run.sink_every",
                "0",
                "--run.val_every",
                "0",
                "--optim.eps",
                "1e-4",
            ],
            monkeypatch,
            mlflow_server,
        )
        == 0
    )
    assert sorted(losses(run_dir)) == [8]
    assert losses(run_dir)[8] == pytest.approx(losses(runs["ddp"])[8], abs=2e-6)


def test_the_paper_recipe_assembles_its_zero_stage(tiny_ds, tmp_path, monkeypatch, mlflow_server):
    """paper-60m.yaml's strategy with each ZeRO JSON: the stage, micro-batch, accumulation and
    clipping DeepSpeed receives; and the registered names select the same CPU-capable class."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.chdir(REPO)
    for stage in (1, 2, 3):
        with built_fit(
            [
                "--config",
                "configs/recipes/paper-60m.yaml",
                *paths(tiny_ds, tmp_path / f"zero{stage}"),
                "--trainer.accelerator",
                "cpu",
                "--trainer.devices",
                "1",
                "--arch.max_seq_len",
                "64",
                "--data.global_batch_tokens",
                "128",
                "--data.micro_batch_size",
                "2",
                "--trainer.strategy.init_args.config",
                f"configs/deepspeed/zero{stage}.json",
            ]
        ) as cli:
            strategy = cli.trainer.strategy
            assert type(strategy) is DeepSpeedStrategy
            strategy.connect(cli.model)
            cli.model.trainer = cli.trainer
            strategy._format_config()
            cfg = strategy.config
            assert cfg["zero_optimization"]["stage"] == stage and strategy.zero_stage_3 == (stage == 3)
            assert cfg["train_micro_batch_size_per_gpu"] == 2
            assert cfg["gradient_accumulation_steps"] == 4 == cli.trainer.accumulate_grad_batches  # 8 seqs / 2
            assert cfg["gradient_clipping"] == 1.0 and cfg["bf16"]["enabled"] is True
            assert cli.trainer.max_steps == 20000 and cli.model.optim.lr == 4e-4
    for name in ("deepspeed", "deepspeed_stage_1", "deepspeed_stage_2", "deepspeed_stage_3"):
        assert StrategyRegistry[name]["strategy"] is DeepSpeedStrategy
    assert issubclass(DeepSpeedStrategy, LightningDeepSpeedStrategy)


def test_resume_auto_passes_over_a_deepspeed_checkpoint_missing_a_partition(runs, tiny_ds, tmp_path, mlflow_server):
    run_dir = tmp_path / "damaged"
    for step in (4, 8):
        name = f"step-{step:06d}.ckpt"
        shutil.copytree(runs["zero2"] / "checkpoints" / name, run_dir / "checkpoints" / name)
    lost = run_dir / "checkpoints" / "step-000008.ckpt" / "checkpoint" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    lost.unlink()
    out = fit([*paths(tiny_ds, run_dir), "--resume", "auto", *zero(2), "--trainer.max_steps", "6"], mlflow_server)
    assert (
        f"sinklab fit: warning: passing over {lost.parents[1]}: written by 2 ranks but "
        "zero_pp_rank_1_mp_rank_00_optim_states.pt is missing"
    ) in out
    assert sorted(losses(run_dir)) == [4, 5] and losses(run_dir)[4] == losses(runs["zero2"])[4]
