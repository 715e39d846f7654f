"""The optimizers beyond torch's AdamW and SGD: Muon with AdamW beside it (per logical matrix of a fused
weight) and OrthoAdam (Kaul et al., ICLR 2025: AdamW in a fixed random orthogonal basis per parameter).
Their definitions and deviations: docs/training.md, "The optimiser"."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor, nn


def muon_split(model: nn.Module) -> tuple[list[str], list[str]]:
    """Names of the parameters Muon updates (``nn.Linear`` weights in ``model.blocks``) and of the rest."""
    hidden = {
        id(module.weight)
        for module in getattr(model, "blocks", nn.ModuleList()).modules()
        if isinstance(module, nn.Linear)
    }
    muon, rest = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (muon if id(p) in hidden else rest).append(name)
    return muon, rest


def fused_rows(model: nn.Module) -> dict[Tensor, tuple[int, ...]]:
    """The weights of ``nn.Linear`` modules declaring ``fused_rows``, with each logical matrix's rows."""
    return {m.weight: tuple(m.fused_rows) for m in model.modules() if hasattr(m, "fused_rows")}


def token_matrices(model: nn.Module) -> list[Tensor]:
    """The token embedding's and the LM head's weights (one tensor when tied): rows are tokens."""
    return [m.weight for m in (getattr(model, "embed", None), getattr(model, "lm_head", None)) if m is not None]


def _evaluate(closure) -> Tensor | None:
    """The loss of torch.optim's optional closure, with gradients on."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class SplitMuon(torch.optim.Muon):
    """torch.optim.Muon that updates each fused weight (``rows``: weight -> its matrices' row counts) per
    logical matrix; a DTensor weight (FSDP2) is split gathered and written back to its shards."""

    def __init__(self, params, rows: dict[Tensor, tuple[int, ...]], **kwargs):
        super().__init__(params, **kwargs)
        self.rows = rows
        self._gathered: list[tuple[Tensor, ...]] = []

    def _init_group(self, group, params, grads, bufs):
        has_complex = super()._init_group(group, params, grads, bufs)
        for i in reversed(range(len(params))):
            p, buf = params[i], bufs[i]
            if p not in self.rows:
                continue
            whole = [_full(t) for t in (p, grads[i], buf)]  # views where p is a plain tensor
            if whole[0] is not p:
                self._gathered.append((p, buf, whole[0], whole[2]))
            params[i : i + 1], grads[i : i + 1], bufs[i : i + 1] = (t.split(self.rows[p]) for t in whole)
        return has_complex

    @torch.no_grad()
    def step(self, closure=None):
        self._gathered = []
        loss = super().step(closure)
        for p, buf, p_full, buf_full in self._gathered:
            p.copy_(_placed_like(p_full, p))
            buf.copy_(_placed_like(buf_full, buf))
        return loss


class MuonAdamW(torch.optim.Optimizer):
    """One optimizer over ``muon_groups`` (:class:`SplitMuon`) and ``adamw_groups`` (AdamW), sharing their group
    dicts (marked ``muon: True`` or ``False``) and state, so a scheduler and a checkpoint see every group."""

    def __init__(self, muon_groups: list[dict], adamw_groups: list[dict], muon: dict, adamw: dict, rows: dict):
        for groups, muon_marked in ((muon_groups, True), (adamw_groups, False)):
            for group in groups:
                group["muon"] = muon_marked
        self._muon = SplitMuon(muon_groups, rows, **muon)
        self._adamw = torch.optim.AdamW(adamw_groups, **adamw)
        super().__init__(muon_groups + adamw_groups, {})
        self._link()

    def _link(self) -> None:
        self._muon.param_groups = [g for g in self.param_groups if g["muon"]]
        self._adamw.param_groups = [g for g in self.param_groups if not g["muon"]]
        self._muon.state = self._adamw.state = self.state

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._link()

    @torch.no_grad()
    def step(self, closure=None):
        loss = _evaluate(closure)
        self._muon.step()
        self._adamw.step()
        return loss


def random_orthogonal(n: int, generator: torch.Generator) -> Tensor:
    """A Haar-random orthogonal ``[n, n]`` matrix (QR of a Gaussian, signs fixed by R's diagonal)."""
    q, r = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()


class _Rotation:
    """Block-diagonal orthogonal matrices for the rows (``left``, unless not ``rows``) and columns (``right``) of
    a parameter viewed as ``[m, n]``; a dimension of size 1 is not rotated."""

    def __init__(
        self, shape: torch.Size, block: int, generator: torch.Generator | None, device: torch.device, rows: bool = True
    ):
        m = shape[0] if len(shape) > 1 else 1
        n = math.prod(shape) // m

        def side(size: int) -> list[Tensor]:
            if size == 1:
                return []
            count = math.ceil(size / block)  # the fewest near-equal blocks of at most `block`
            sizes = [size // count + (i < size % count) for i in range(count)]
            if generator is None:
                return [torch.eye(b, device=device) for b in sizes]
            return [random_orthogonal(b, generator).to(device) for b in sizes]

        self.shape, self.left, self.right = (m, n), side(m) if rows else [], side(n)

    def _apply(self, x: Tensor, back: bool) -> Tensor:
        x = x.reshape(self.shape)
        if self.left:
            mats = [q.T if back else q for q in self.left]
            x = torch.cat([q @ part for q, part in zip(mats, x.split([q.shape[0] for q in mats]))])
        if self.right:
            mats = [q if back else q.T for q in self.right]
            x = torch.cat([part @ q for q, part in zip(mats, x.split([q.shape[0] for q in mats], dim=1))], dim=1)
        return x

    def forward(self, x: Tensor) -> Tensor:
        """L x Rᵀ, in x's shape."""
        return self._apply(x, back=False).reshape(x.shape)

    def back(self, x: Tensor) -> Tensor:
        """Lᵀ x R, in x's shape."""
        return self._apply(x, back=True).reshape(x.shape)


def _full(x: Tensor) -> Tensor:
    """The whole tensor of a DTensor (an all-gather), the tensor itself otherwise."""
    return x.full_tensor() if hasattr(x, "full_tensor") else x


def _placed_like(full: Tensor, ref: Tensor) -> Tensor:
    """``full`` (the same on every rank) sharded as ``ref`` is, where ``ref`` is a DTensor."""
    if not hasattr(ref, "device_mesh"):
        return full
    from torch.distributed.tensor import DTensor, Replicate

    mesh = ref.device_mesh
    return DTensor.from_local(full, mesh, [Replicate()] * mesh.ndim, run_check=False).redistribute(mesh, ref.placements)


class OrthoAdam(torch.optim.Optimizer):
    """AdamW in a fixed random orthogonal basis per parameter, re-derived from ``seed`` and its index (so a
    resume rebuilds it); ``identity``: AdamW exactly; ``token_rows``: rotated along their columns only."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        seed: int = 0,
        block: int = 1024,
        identity: bool = False,
        token_rows: Iterable[Tensor] = (),
    ):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.seed, self.block, self.identity = seed, block, identity
        self.token_rows = {id(p) for p in token_rows}
        self._rotations: dict[Tensor, _Rotation] = {}

    def _rotation(self, index: int, p: Tensor) -> _Rotation:
        if p not in self._rotations:
            generator = None if self.identity else torch.Generator().manual_seed(self.seed * 1_000_003 + index)
            self._rotations[p] = _Rotation(p.shape, self.block, generator, p.device, id(p) not in self.token_rows)
        return self._rotations[p]

    @torch.no_grad()
    def step(self, closure=None):
        loss = _evaluate(closure)
        pairs = ((group, p) for group in self.param_groups for p in group["params"])
        for index, (group, p) in enumerate(pairs):  # index: the parameter's place, stable across resumes
            if p.grad is None:
                continue
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            rotation = self._rotation(index, p)
            grad = _placed_like(rotation.forward(_full(p.grad)), p)
            state = self.state[p]
            if not state:
                state.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(grad), exp_avg_sq=torch.zeros_like(grad))
            exp_avg, exp_avg_sq, step_t = state["exp_avg"], state["exp_avg_sq"], state["step"]
            # torch's single-tensor AdamW, operation for operation
            step_t += 1
            p.mul_(1 - lr * wd)
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step = step_t.item()
            step_size = lr / (1 - beta1**step)
            denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(eps)
            update = (exp_avg * -step_size) / denom  # addcdiv_'s order: (value * t1) / t2
            p.add_(_placed_like(rotation.back(_full(update)), p))
        return loss
