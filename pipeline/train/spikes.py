"""The spike guard (``run.skip_spikes``): a step whose loss or gradient norm lies more than ``sigmas``
standard deviations above the mean of the last ``window`` steps is not applied (docs/training.md)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch


@dataclass
class SpikeGuard:
    window: int = 128
    sigmas: float = 6.0
    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # the optimizer steps not applied

    @property
    def needed(self) -> int:
        """Steps of history before a verdict: the first step the guard can skip."""
        return max(20, self.window // 2)

    def _spike(self, history: list[float], value: float) -> bool:
        if len(history) < self.needed:
            return False
        mean, std = statistics.fmean(history), statistics.stdev(history)
        return std > 0 and value > mean + self.sigmas * std

    def check(self, step: int, loss: float, grad_norm: float) -> bool:
        """Whether step ``step`` (loss, pre-clip gradient norm) is skipped; both enter the window."""
        skip = self._spike(self.losses, loss) or self._spike(self.grad_norms, grad_norm)
        for history, value in ((self.losses, loss), (self.grad_norms, grad_norm)):
            history.append(value)
            del history[: -self.window]
        if skip:
            self.skipped.append(step)
        return skip

    def state_dict(self) -> dict:
        return {"losses": list(self.losses), "grad_norms": list(self.grad_norms), "skipped": list(self.skipped)}

    def load_state_dict(self, state: dict) -> None:
        self.losses, self.grad_norms, self.skipped = (list(state[k]) for k in ("losses", "grad_norms", "skipped"))


def with_grads(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's parameters that have a gradient."""
    return [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def grad_norm(optimizer: torch.optim.Optimizer) -> float:
    """The global L2 norm of the optimizer's gradients (over the mesh, for FSDP2's DTensors)."""
    total = torch.nn.utils.get_total_norm([p.grad for p in with_grads(optimizer)])  # no gradients: 0
    return float(total.full_tensor() if hasattr(total, "full_tensor") else total)


def drop_gradients(optimizer: torch.optim.Optimizer) -> None:
    """Leave the step undone: torch's optimizers pass over a parameter without a gradient."""
    for p in with_grads(optimizer):
        p.grad = None
