"""Pure pieces of the training layer, checked against hand-computed values."""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch

from pipeline.checkpoint import RunDir, RunDirError, acquire_lock, release_lock
from pipeline.model import ModelConfig
from pipeline.model.config import ConfigError
from pipeline.train.batching import BatchConfigError, plan_batch
from pipeline.train.data import GlobalOrder, RankBatchSampler
from pipeline.train.interventions import Interventions, apply_interventions
from pipeline.train.module import SinkLabModule
from pipeline.train.optim import OptimConfig, build_optimizer, build_scheduler, param_groups

SPECIAL = {"bos": 1, "eos": 2, "pad": 0}


# ---- batch arithmetic ---------------------------------------------------------------------------
def test_paper_batch_is_512_sequences():
    plan = plan_batch(2**20, 2048, 16, 8)
    assert (plan.global_batch_seqs, plan.grad_accum) == (512, 4)


@pytest.mark.parametrize(
    "args, fragment",
    [
        ((1000, 16, 4, 1), "use 960 or 1024"),
        ((128, 16, 4, 3), "3 processes cannot share evenly"),
        ((128, 16, 3, 1), "micro batch sizes that work: [1, 2, 4]"),
    ],
)
def test_impossible_batches_say_what_works(args, fragment):
    with pytest.raises(BatchConfigError) as err:
        plan_batch(*args)
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    "args", [(100, 16, 4, 1), (0, 16, 4, 1), (96, 16, 4, 1), (40, 16, 4, 1), (144, 16, 2, 2), (160, 16, 4, 3)]
)
def test_every_suggested_batch_is_accepted(args):
    """Every batch a refusal suggests ("use 96 or 112" for 100 tokens at C=16, micro 4) is accepted."""
    tokens, context, micro, world = args
    with pytest.raises(BatchConfigError) as err:
        plan_batch(*args)
    message = str(err.value)
    batches = re.findall(r"(?:use|change the batch to|multiple of) (\d+)(?: or (\d+))?", message)
    worlds = re.search(r"world sizes that divide it: \[([\d, ]*)\]", message)
    micros = re.search(r"micro batch sizes that work: \[([\d, ]*)\]", message)
    assert batches or worlds or micros, message
    for value in [int(v) for pair in batches for v in pair if v]:
        plan_batch(value, context, micro, world)
    for w in [int(v) for v in worlds.group(1).split(",") if v.strip()] if worlds else []:
        plan_batch(tokens, context, micro, w)
    for m in [int(v) for v in micros.group(1).split(",") if v.strip()] if micros else []:
        plan_batch(tokens, context, m, world)


# ---- schedule -----------------------------------------------------------------------------------
def test_warmup_then_cosine_to_the_floor():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([p], lr=1.0)
    sched = build_scheduler(opt, OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=2), max_steps=6)
    seen = []
    for _ in range(7):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    c = lambda k: 0.1 + 0.9 * (1 + math.cos(math.pi * k / 4)) / 2  # noqa: E731
    assert seen == pytest.approx([0.5, 1.0, 1.0, c(1), c(2), c(3), 0.1], abs=1e-9)
    assert min(seen) == pytest.approx(0.1) and max(seen) == 1.0


def test_min_lr_must_be_below_peak():
    with pytest.raises(ConfigError, match="min_lr"):
        OptimConfig(lr=1e-3, min_lr=1e-3).validate(100)


def test_sgd_choice_builds_sgd_with_momentum_and_the_decay_groups():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2))
    sgd = build_optimizer(model, OptimConfig(name="sgd", lr=0.03, momentum=0.8, weight_decay=1e-4, decay_on="matrices"))
    assert type(sgd) is torch.optim.SGD and sgd.defaults["momentum"] == 0.8 and sgd.defaults["lr"] == 0.03
    assert [g["weight_decay"] for g in sgd.param_groups] == [1e-4, 0.0]
    assert type(build_optimizer(model, OptimConfig())) is torch.optim.AdamW
    with pytest.raises(ConfigError, match="optim.momentum=1.0"):
        OptimConfig(name="sgd", momentum=1.0).validate(1000)


def test_weight_decay_groups():
    cfg = ModelConfig.from_preset("micro", sink_tokens=1)
    module = SinkLabModule(cfg)
    from pipeline.model import Transformer

    model = Transformer(cfg)
    n_all = sum(1 for _ in model.parameters())
    assert [len(g["params"]) for g in param_groups(model, OptimConfig(decay_on="all"))] == [n_all]
    decay, keep = param_groups(model, OptimConfig(decay_on="matrices"))
    assert all(p.ndim >= 2 for p in decay["params"]) and all(p.ndim < 2 for p in keep["params"])
    assert keep["weight_decay"] == 0.0 and len(keep["params"]) == 2 * cfg.n_layers + 1  # RMSNorm gains
    decay2, keep2 = param_groups(model, OptimConfig(decay_on="matrices_no_embeddings"))
    assert len(keep2["params"]) == len(keep["params"]) + 2  # + token embedding + sink tokens
    assert module.optim.weight_decay == 0.1


# ---- data order ---------------------------------------------------------------------------------
def test_epochs_are_permutations_and_budget_repeats_a_subset():
    order = GlobalOrder(50, seed=3)
    for e in range(3):
        assert sorted(order.lookup(e * 50 + i)[1] for i in range(50)) == list(range(50))
    budget = GlobalOrder(50, seed=3, budget_sequences=10)
    seen = [budget.lookup(g) for g in range(30)]
    pool = {i for _, i in seen}
    assert len(pool) == 10
    for e in range(3):
        assert sorted(i for ep, i in seen if ep == e) == sorted(pool)


def test_ranks_split_each_step_and_resume_skips_exactly():
    plan = plan_batch(8 * 16, 16, 2, 2)  # 8 seqs, world 2, micro 2 -> accum 2
    samplers = [RankBatchSampler(plan, r, total_steps=3) for r in range(2)]
    per_rank = [list(s) for s in samplers]
    assert len(per_rank[0]) == len(samplers[0]) == 6
    for step in range(3):
        got = sorted(i for r in range(2) for b in per_rank[r][2 * step : 2 * step + 2] for i in b)
        assert got == list(range(8 * step, 8 * step + 8))
    samplers[1].start_sample = 16  # two steps done
    assert list(samplers[1]) == per_rank[1][4:]


# ---- interventions ------------------------------------------------------------------------------
def test_resample_positions_uniform_and_deterministic():
    V, B = 64, 4000
    tokens = np.full((B, 6), 5, dtype=np.int64)
    ids, epochs = np.arange(B), np.zeros(B, dtype=np.int64)
    cfg = Interventions(resample=[1, 2])
    out = apply_interventions(tokens, ids, epochs, cfg, V, seed=0, special_ids=SPECIAL)
    assert (out[:, 2:] == 5).all() and (tokens == 5).all()
    again = apply_interventions(tokens[:200], ids[:200], epochs[:200], cfg, V, seed=0, special_ids=SPECIAL)
    assert np.array_equal(out[:200], again)
    other_epoch = apply_interventions(tokens[:200], ids[:200], epochs[:200] + 1, cfg, V, seed=0, special_ids=SPECIAL)
    assert (other_epoch[:, :2] != out[:200, :2]).mean() > 0.9
    for col in (0, 1):
        counts = np.bincount(out[:, col], minlength=V)
        chi2 = ((counts - B / V) ** 2 / (B / V)).sum()
        assert chi2 < 110, chi2  # 63 degrees of freedom: p < 0.001 beyond ~103
    assert np.corrcoef(out[:, 0], out[:, 1])[0, 1] < 0.05


@pytest.mark.parametrize("position", [1, 2, 3])
def test_fix_token_at_a_position(position):
    tokens = np.arange(40, dtype=np.int64).reshape(4, 10)
    cfg = Interventions(fix_position=position, fix_token="bos")
    cfg.validate(10, SPECIAL)
    out = apply_interventions(tokens, np.arange(4), np.zeros(4, int), cfg, 64, 0, SPECIAL)
    assert (out[:, position - 1] == 1).all()
    keep = [c for c in range(10) if c != position - 1]
    assert np.array_equal(out[:, keep], tokens[:, keep])


def test_bad_intervention_names_the_field():
    with pytest.raises(ConfigError, match="fix_token='cls'.*bos"):
        Interventions(fix_position=1, fix_token="cls").validate(10, SPECIAL)
    with pytest.raises(ConfigError, match="resample: position 11"):
        Interventions(resample=[11]).validate(10, SPECIAL)


# ---- prefix-LM loss -----------------------------------------------------------------------------
def test_prefix_lm_loss_starts_after_p_tokens():
    from pipeline.model import Transformer

    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("micro", mask="prefix", prefix_len=3)
    module = SinkLabModule(cfg)
    module.model = Transformer(cfg)
    tokens = torch.randint(0, 64, (2, 10))
    logits = module.model(tokens).logits
    # L = sum_{t=p+1..C} log p(x_t | ...): targets x_4..x_10 (1-based) = tokens[:, 3:]
    expected = torch.nn.functional.cross_entropy(logits[:, 2:-1].reshape(-1, 64), tokens[:, 3:].reshape(-1))
    assert module.loss_start() == 2
    assert torch.allclose(module.lm_loss(tokens), expected)


# ---- run directory lock -------------------------------------------------------------------------
def _write_lock(run: RunDir, pid: int, job: str | None = None):
    import json

    run.root.mkdir(parents=True, exist_ok=True)
    run.lock_path.write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "slurm_job_id": job}))


def test_lock_refuses_a_live_job_and_takes_over_dead_or_requeued(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    run = RunDir(tmp_path / "run")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _write_lock(run, live.pid)
        with pytest.raises(RunDirError, match=f"in use by pid {live.pid}"):
            acquire_lock(run)
        monkeypatch.setenv("SLURM_JOB_ID", "777")
        _write_lock(run, live.pid, job="777")  # requeued SLURM job: same id, maybe another node
        assert acquire_lock(run)["pid"] == os.getpid()
    finally:
        live.kill()
        live.wait()
    monkeypatch.delenv("SLURM_JOB_ID")
    _write_lock(run, live.pid)  # now a dead pid on this host
    assert acquire_lock(run)["pid"] == os.getpid()
    release_lock(run)
    assert not run.lock_path.exists()


def test_newest_checkpoint_skips_partial_and_prunes(tmp_path):
    run = RunDir(tmp_path)
    run.create()
    for step in (4, 8, 12):
        (run.checkpoints / f"step-{step:06d}.ckpt").write_bytes(b"x")
    (run.checkpoints / ".step-000016.ckpt.partial").write_bytes(b"x")
    (run.checkpoints / "step-000020.ckpt").mkdir()  # DeepSpeed dir without 'latest': incomplete
    assert run.newest_checkpoint().name == "step-000012.ckpt"
    run.prune(2)
    assert [s for s, _ in run.step_checkpoints()] == [8, 12]


# ---- speed options: same numbers, other execution ------------------------------------------------
@pytest.mark.parametrize("option", ["activation_checkpointing", "compile"])
def test_speed_options_leave_loss_and_gradients_unchanged(option, monkeypatch):
    from pipeline.train import module as module_mod

    recomputed = []
    real_checkpoint = module_mod.checkpoint
    monkeypatch.setattr(module_mod, "checkpoint", lambda *a, **kw: recomputed.append(1) or real_checkpoint(*a, **kw))

    def loss_and_grads(**flags):
        torch.manual_seed(0)
        module = SinkLabModule(ModelConfig.from_preset("micro", vocab_size=64), **flags)
        module.configure_model()
        tokens = torch.randint(0, 64, (2, 16))
        loss = module.lm_loss(tokens)
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in module.model.named_parameters()}, module

    loss, grads, _ = loss_and_grads()
    loss2, grads2, module = loss_and_grads(**{option: True})
    torch.testing.assert_close(loss2, loss, rtol=1e-5, atol=1e-6)
    assert grads2.keys() == grads.keys()  # in-place: checkpoints keep their parameter names
    for name in grads:
        torch.testing.assert_close(grads2[name], grads[name], rtol=1e-4, atol=1e-6, msg=name)
    if option == "compile":
        assert all(block._compiled_call_impl is not None for block in module.model.blocks)
    else:
        assert len(recomputed) == len(module.model.blocks)


def test_summary_trajectory_thins_and_keeps_the_last_point():
    from pipeline.train.summary import sink_trajectory

    history = [(s, s / 10, s / 1000) for s in range(0, 500, 100)]
    assert sink_trajectory(history, width=2) == "0:0.0%  200:20.0%  400:40.0%"
    assert sink_trajectory(history, width=2, column=2, fmt="{:.3f}") == "0:0.000  200:0.200  400:0.400"
    assert sink_trajectory([]) == "(no sink measurements)"


def test_a_validation_loss_that_turns_upward_is_called_memorising():
    from pipeline.metrics import memorising

    issue_27 = [(250, 3.4), (500, 2.95), (750, 2.81), (1000, 3.3), (1500, 4.4), (2000, 5.07)]  # gpu-small, embedded
    assert memorising(issue_27) == (
        "valid loss rising since step 750 (min 2.810 at 750, 5.070 at 2000): the model "
        "memorises its data; more data or fewer steps"
    )
    assert memorising([(0, 5.0), (250, 4.0), (500, 3.5)]) is None  # still falling
    assert memorising([(0, 5.0), (250, 4.0), (500, 4.05), (750, 4.06)]) is None  # flat within 3%
    assert memorising([(0, 5.0), (250, 4.0), (500, 4.5)]) is None  # one point after the minimum
    assert memorising([(0, 4.0), (250, float("nan")), (500, 4.5), (750, 4.6)]) is not None


def test_health_reads_train_loss_at_its_logged_cadence(tmp_path):
    """The gpu-check summary once called a healthy run broken: train/loss is logged every
    log_every_n_steps, not every step, and the last step is not a multiple of it."""
    import json

    from pipeline.train.summary import health_problems

    def write(rows):
        path = tmp_path / "metrics.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return path

    healthy = [{"step": s, "train/loss": 8.5 - s / 100, "train/lr": 1e-4} for s in range(0, 200, 10)]
    healthy += [{"step": s, "perf/tokens_per_s": 4e5} for s in range(10, 201, 10)] + [{"step": 100, "val/loss": 7.0}]
    assert health_problems(write(healthy), max_steps=200, log_every=10) == []
    # a resumed run: the first start logged up to step 110 before it stopped at its step-100 checkpoint
    resumed = healthy[:12] + healthy[10:]
    assert health_problems(write(resumed), max_steps=200, log_every=10) == []
    assert health_problems(write(healthy[10:]), max_steps=200, log_every=10, first_step=100) == []
    gap = [row for row in healthy if row["step"] not in (120, 130)]
    assert health_problems(write(gap), 200, 10) == ["train/loss missing at step 120, 130 (due every 10 steps from 0)"]
    nan = healthy[:5] + [{"step": 50, "train/loss": float("nan")}] + healthy[6:]
    assert health_problems(write(nan), 200, 10) == ["train/loss is nan at step 50"]
    assert health_problems(write([]), 20, 10) == ["train/loss missing at step 0, 10 (due every 10 steps from 0)"]
