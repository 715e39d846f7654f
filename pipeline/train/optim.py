"""The optimizers (``optim.name``: adamw, sgd, muon, orthoadam; docs/training.md) and the paper's schedule:
linear warm-up, then cosine decay to ``min_lr`` (a tenth of the peak by default; the paper states none)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch.optim.lr_scheduler import LambdaLR

from pipeline.model.config import ConfigError

from .optimizers import MuonAdamW, OrthoAdam, fused_rows, muon_split, token_matrices

DecayOn = Literal["all", "matrices", "matrices_no_embeddings"]
OptimizerName = Literal["adamw", "sgd", "muon", "orthoadam"]
OPTIMIZERS = get_args(OptimizerName)


@dataclass
class OptimConfig:
    """The optimizer and the learning-rate schedule (docs/training.md)."""

    lr: float = 4e-4
    """Peak learning rate, reached at the end of the warm-up."""
    min_lr: float = 4e-5
    """The cosine's floor, reached at the last step; below lr."""
    warmup_steps: int = 100
    """Steps of linear warm-up from lr/warmup_steps to lr."""
    weight_decay: float = 0.1
    """AdamW's decoupled decay ratio (SGD's L2 coefficient)."""
    decay_on: DecayOn = "all"
    """Which parameters decay: all, matrices (not 1-d tensors), or matrices_no_embeddings (nor embeddings)."""
    beta1: float = 0.9
    """β₁ of AdamW, OrthoAdam and Muon's AdamW half."""
    beta2: float = 0.95
    """β₂ of AdamW, OrthoAdam and Muon's AdamW half."""
    eps: float = 1e-8
    """ε of AdamW, OrthoAdam and Muon's AdamW half."""
    fused: bool | None = None
    """AdamW's fused kernel (one launch for every tensor); null: where every parameter is on a GPU."""
    name: OptimizerName = "adamw"
    """The optimizer (docs/training.md, "The optimiser")."""
    momentum: float = 0.9
    """SGD's momentum."""
    muon_lr: float | None = None
    """Muon's peak learning rate; null: lr."""
    muon_momentum: float = 0.95
    """Muon's (Nesterov) momentum."""
    rotation_seed: int = 0
    """The seed of OrthoAdam's fixed rotations, 32 bits."""

    def validate(self, max_steps: int) -> None:
        """The checks torch's AdamW makes (it raises a bare ValueError mid-fit), named by field."""
        if not self.lr > 0:
            raise ConfigError(f"optim.lr={self.lr}: must be positive (the paper's is 4e-4)")
        for name in ("beta1", "beta2", "momentum", "muon_momentum"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"optim.{name}={getattr(self, name)}: must be in [0, 1)")
        for name in ("eps", "weight_decay"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"optim.{name}={getattr(self, name)}: must be >= 0")
        if not 0 <= self.min_lr < self.lr:
            raise ConfigError(f"optim.min_lr={self.min_lr}: must be >= 0 and below lr={self.lr}")
        if not 0 <= self.warmup_steps < max_steps:
            raise ConfigError(f"optim.warmup_steps={self.warmup_steps}: must be in [0, trainer.max_steps={max_steps})")
        if self.name not in OPTIMIZERS:
            raise ConfigError(f"optim.name={self.name!r}: allowed values are {', '.join(OPTIMIZERS)}")
        if self.muon_lr is not None and not self.muon_lr > 0:
            raise ConfigError(f"optim.muon_lr={self.muon_lr}: must be positive (or null: optim.lr)")
        if not 0 <= self.rotation_seed < 2**32:  # OrthoAdam derives a torch seed per parameter from it
            raise ConfigError(f"optim.rotation_seed={self.rotation_seed}: must be in 0..{2**32 - 1} (32 bits)")


def _no_decay(name: str, p: torch.nn.Parameter, decay_on: DecayOn) -> bool:
    if decay_on == "all":
        return False
    if p.ndim < 2:
        return True
    return decay_on == "matrices_no_embeddings" and name.endswith(("embed.weight", "sink_tokens"))


def param_groups(model: torch.nn.Module, cfg: OptimConfig, skip: frozenset[str] = frozenset()) -> list[dict]:
    """The decaying and the non-decaying parameters (``decay_on``), less those named in ``skip``."""
    decay, keep = [], []
    for name, p in model.named_parameters():
        if p.requires_grad and name not in skip:
            (keep if _no_decay(name, p, cfg.decay_on) else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}]
    if keep:
        groups.append({"params": keep, "weight_decay": 0.0})
    return groups


def optimizer_split(model: torch.nn.Module, cfg: OptimConfig) -> dict[str, str]:
    """Which optimiser updates how many tensors and elements, and at which peak lr (MLflow params)."""
    params = dict(model.named_parameters())
    muon = set(muon_split(model)[0]) if cfg.name == "muon" else set()
    halves = {"muon": (sorted(muon), cfg.muon_lr or cfg.lr)} if muon else {}
    halves["adamw" if cfg.name in ("adamw", "muon") else cfg.name] = (sorted(set(params) - muon), cfg.lr)
    return {
        f"optim.split.{half}": f"{len(names)} tensors, {sum(params[n].numel() for n in names):,} elements, lr {lr:g}"
        for half, (names, lr) in halves.items()
    }


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    if cfg.name == "sgd":
        return torch.optim.SGD(param_groups(model, cfg), lr=cfg.lr, momentum=cfg.momentum)
    adam = {"lr": cfg.lr, "betas": (cfg.beta1, cfg.beta2), "eps": cfg.eps}
    if cfg.name == "orthoadam":
        return OrthoAdam(param_groups(model, cfg), **adam, seed=cfg.rotation_seed, token_rows=token_matrices(model))
    fused = cfg.fused if cfg.fused is not None else all(p.is_cuda for p in model.parameters())
    adamw = adam | {"fused": fused or None}
    if cfg.name == "muon":
        hidden = muon_split(model)[0]
        params = dict(model.named_parameters())
        muon_groups = [{"params": [params[n] for n in hidden], "weight_decay": cfg.weight_decay}]
        muon = {"lr": cfg.muon_lr or cfg.lr, "momentum": cfg.muon_momentum, "adjust_lr_fn": "match_rms_adamw"}
        return MuonAdamW(muon_groups, param_groups(model, cfg, frozenset(hidden)), muon, adamw, fused_rows(model))
    return torch.optim.AdamW(param_groups(model, cfg), **adamw)


@dataclass
class WarmupCosine:
    """The lr factor (of the peak) at optimizer step s: linear warm-up (s+1)/W for s < W, then a
    cosine from ``start`` at step ``decay_from`` down to ``floor`` at step ``end``, and ``floor``
    after it. A fresh run decays from 1 at W; a resume that changes ``trainer.max_steps``
    re-anchors the cosine at the step it resumes from (:meth:`extend`)."""

    warmup: int
    decay_from: int
    start: float
    end: int
    floor: float

    def __call__(self, s: int) -> float:
        if s < self.warmup:
            return (s + 1) / self.warmup
        if s >= self.end:
            return self.floor
        progress = (s - self.decay_from) / (self.end - self.decay_from)
        return self.floor + (self.start - self.floor) * (1 + math.cos(math.pi * progress)) / 2

    def extend(self, at: int, end: int) -> None:
        """Continue from step ``at`` to a new last step ``end``: no jump in lr (the cosine starts
        from the factor it has at ``at``) and no second warm-up."""
        if at > self.warmup:
            self.decay_from, self.start = at, self(at)
        self.end = end


class Schedule(LambdaLR):
    """LambdaLR over one :class:`WarmupCosine`, which travels in the checkpoint; a resume to another
    ``max_steps`` extends the restored shape to the new end."""

    def __init__(self, optimizer: torch.optim.Optimizer, shape: WarmupCosine):
        self.shape = shape
        self.wanted_end = shape.end
        super().__init__(optimizer, shape)

    _OWN = ("shape", "wanted_end")  # this start's, not the checkpoint's: kept out of the state

    def state_dict(self) -> dict:
        return {k: v for k, v in super().state_dict().items() if k not in self._OWN}

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict({k: v for k, v in state_dict.items() if k not in self._OWN})
        if self.shape.end != self.wanted_end:
            self.shape.extend(self.last_epoch, self.wanted_end)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, max_steps: int) -> Schedule:
    """Step-wise: lr(s) = lr * (s+1)/W for s < W, then min_lr + (lr-min_lr)(1+cos(pi (s-W)/(S-W)))/2."""
    return Schedule(optimizer, WarmupCosine(cfg.warmup_steps, cfg.warmup_steps, 1.0, max_steps, cfg.min_lr / cfg.lr))
