"""pipeline/train/optim.py: the warmup and cosine schedule, the optimiser's choice and fields, and
its weight-decay groups, checked against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.model import ModelConfig
from pipeline.model.config import ConfigError
from pipeline.train.module import SinkLabModule
from pipeline.train.optim import OptimConfig, build_optimizer, build_scheduler, param_groups


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
