"""Information flow through the layers: over-mixing sensitivity by finite perturbation (Barbero et al. 2025) and the
matrix entropy of the token representations (Queipo-de-Llano et al. 2025); definitions in docs/analysis.md."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, fields

import torch
from torch import Tensor, nn

from pipeline import metric_names as N
from pipeline.metrics import first_token_norm_ratio
from pipeline.outliers import capturing_block_outputs

DEFAULT_RHO = 0.01  # perturbation size relative to ‖e_p‖: small enough to read the linear response
DIRECTION_SEED = 0  # the perturbation directions are drawn from this seed, batch after batch
TRAINING_MIXING_SEQUENCES = 25  # training's probe perturbs its first 25 sequences: one batch, not four


def matrix_entropy(x: Tensor) -> Tensor:
    """Normalised matrix entropy of each ``x [..., T, d] -> [...]``: λ = eigenvalues of X Xᵀ / tr(X Xᵀ) (σ_j² / ‖X‖²_F,
    summing to 1); the von Neumann S = −Σ λ log λ over log min(T, d): 0 for a rank-1 X, 1 for orthogonal rows of equal
    norm, NaN for an all-zero X."""
    if x.dim() < 2 or min(x.shape[-2:]) < 2:
        raise ValueError(f"matrix_entropy needs [..., T, d] with T, d >= 2, got {tuple(x.shape)}")
    x = x.double()
    gram = x @ x.transpose(-1, -2) if x.shape[-2] <= x.shape[-1] else x.transpose(-1, -2) @ x  # the smaller one
    s2 = torch.linalg.eigvalsh(gram).clamp_min(0.0)  # the squared singular values of x
    lam = s2 / s2.sum(dim=-1, keepdim=True)
    h = torch.special.entr(lam).sum(dim=-1)  # −λ log λ, 0 at λ = 0
    return (h / torch.tensor(float(min(x.shape[-2:]))).log()).clamp_min(0.0).float()


def perturbation_spread(clean: Tensor, perturbed: Tensor, position: int, rho: float) -> Tensor:
    """Over-mixing sensitivity of one layer: ``[B, T, d]`` twice -> ``[B]``, the mean over the
    later tokens i > ``position`` (0-based) of ‖h'_i − h_i‖₂ / ‖h_i‖₂, divided by ``rho``."""
    if clean.shape != perturbed.shape or clean.dim() != 3:
        raise ValueError(
            f"perturbation_spread needs two equal [B, T, d], got {tuple(clean.shape)}, {tuple(perturbed.shape)}"
        )
    if not 0 <= position < clean.shape[1] - 1:
        raise ValueError(f"perturbed position {position} leaves no later token in T={clean.shape[1]}")
    later, moved = clean[:, position + 1 :].double(), perturbed[:, position + 1 :].double()
    relative = (moved - later).norm(dim=-1) / later.norm(dim=-1).clamp_min(torch.finfo(torch.float64).tiny)
    return (relative.mean(dim=-1) / rho).float()


def embedding_module(model: nn.Module) -> nn.Module | None:
    """The module whose output is the input embeddings (``embed``, or HF's ``get_input_embeddings()``), else None."""
    if isinstance(getattr(model, "embed", None), nn.Embedding):
        return model.embed
    get = getattr(model, "get_input_embeddings", None)
    return get() if callable(get) else None


@dataclass
class FlowMeasures:
    """Per layer (block outputs, 0-based; the last before the final norm), means over sequences."""

    entropy: Tensor  # [L] normalised von Neumann entropy of X Xᵀ
    entropy_input: float | None = None  # the same of the input embeddings
    norm_ratio_input: float | None = None  # ‖e_1‖ / mean_{t≠1} ‖e_t‖ of the input embeddings
    mixing: Tensor | None = None  # [L] over-mixing sensitivity (None: the model has no embedding module)
    position: int | None = None  # the perturbed position (0-based)
    rho: float = DEFAULT_RHO

    def to_metrics(self) -> dict[str, float]:
        out = {N.layer(N.FLOW_ENTROPY, l): float(v) for l, v in enumerate(self.entropy)}
        if self.entropy_input is not None:
            out[N.FLOW_ENTROPY_INPUT] = self.entropy_input
        if self.mixing is not None:
            out.update({N.layer(N.FLOW_MIXING, l): float(v) for l, v in enumerate(self.mixing)})
            out[N.FLOW_MIXING_LAST] = float(self.mixing[-1])
        return out

    def landmarks(self, massive_ratio: Tensor) -> dict[str, int | None]:
        """The 0-based block where the ‖h_1‖ ratio ``massive_ratio [L]`` rises most, and where the entropy falls."""
        return {
            N.NORM_JUMP_LAYER: largest_step(massive_ratio.tolist(), self.norm_ratio_input, rise=True),
            N.ENTROPY_DROP_LAYER: largest_step(self.entropy.tolist(), self.entropy_input, rise=False),
        }

    def to_json(self) -> dict:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: v.tolist() if isinstance(v, Tensor) else v for name, v in values.items()}


def capturing_inputs(model: nn.Module, flow: FlowAccumulator | None) -> AbstractContextManager[list[Tensor]]:
    """While inside, ``model``'s input embeddings are appended, detached, to the list it yields (none without flow)."""
    embed = embedding_module(model) if flow is not None else None
    return capturing_block_outputs([] if embed is None else [embed])


def probe_batches(n: int, batch_size: int, mixing_sequences: int | None = None) -> list[tuple[int, int]]:
    """``[start, stop)`` of each probe batch of ``n`` sequences: ``batch_size`` at a time, with a
    batch boundary after the first ``mixing_sequences`` (the ones perturbed; None: all)."""
    split = n if mixing_sequences is None else min(mixing_sequences, n)
    return [(s, min(s + batch_size, end)) for lo, end in ((0, split), (split, n)) for s in range(lo, end, batch_size)]


class FlowAccumulator:
    """Per-sequence entropies and sensitivities over batches, the first ``mixing_sequences`` perturbed (None: all):
    δ_b = rho ‖e_{b,p}‖ u_b added to the embedding of position p of every sequence b, u_b a unit vector drawn from
    ``DIRECTION_SEED`` (the same draws for the same batches)."""

    def __init__(self, mixing_sequences: int | None = None) -> None:
        if mixing_sequences is not None and mixing_sequences < 1:
            raise ValueError(f"mixing_sequences must be >= 1 or None, got {mixing_sequences}")
        self.rho, self.mixing_sequences = DEFAULT_RHO, mixing_sequences
        self.perturbed_rows, self.position = 0, None  # the perturbed position, set by the first perturbed batch
        self.generator = torch.Generator().manual_seed(DIRECTION_SEED)
        self.entropy: list[Tensor] = []  # [B, L]
        self.entropy_input: list[Tensor] = []  # [B]
        self.ratio_input: list[Tensor] = []  # [B]
        self.mixing: list[Tensor] = []  # [B, L]

    def add_pass(
        self,
        model: nn.Module,
        hidden_states: Sequence[Tensor],
        forward: Callable[[], Sequence[Tensor]],
        embedded: Sequence[Tensor],
        seq_len: int,
    ) -> None:
        """One batch: the clean ``hidden_states`` and, given an embedding module, ``forward()`` rerun perturbed."""
        lead, rows = hidden_states[0].shape[1] - seq_len, hidden_states[0].shape[0]
        clean = [h[:, lead:].detach() for h in hidden_states]
        self.entropy.append(torch.stack([matrix_entropy(h.float()) for h in clean], 1).cpu())
        if embedded:
            e = embedded[0].detach().float()
            self.entropy_input.append(matrix_entropy(e).cpu())
            self.ratio_input.append(first_token_norm_ratio(e).cpu())
        embed = embedding_module(model)
        if embed is not None and self.perturbs(rows):
            self.position = seq_len // 2  # the middle: half the tokens after it
            with embed.register_forward_hook(self._perturb):
                perturbed = [h[:, lead:].detach() for h in forward()]
            spread = [perturbation_spread(h, q, self.position, self.rho) for h, q in zip(clean, perturbed)]
            self.mixing.append(torch.stack(spread, 1).cpu())
            self.perturbed_rows += rows

    def _perturb(self, _module, _inputs, out: Tensor) -> Tensor:
        u = torch.randn(out.shape[0], out.shape[-1], generator=self.generator, dtype=torch.float64)
        u = (u / u.norm(dim=-1, keepdim=True)).to(out.device, out.dtype)
        moved = out.clone()
        moved[:, self.position] += self.rho * out[:, self.position].norm(dim=-1, keepdim=True) * u
        return moved

    def perturbs(self, rows: int) -> bool:
        """Whether the next batch of ``rows`` sequences gets the perturbed pass (batches: :func:`probe_batches`)."""
        if self.mixing_sequences is None:
            return True
        left = self.mixing_sequences - self.perturbed_rows
        if 0 < left < rows:
            raise ValueError(f"a batch of {rows} sequences straddles mixing_sequences={self.mixing_sequences}")
        return left > 0

    def measures(self) -> FlowMeasures:
        mean = lambda xs: float(torch.cat(xs).mean()) if xs else None  # noqa: E731
        return FlowMeasures(
            entropy=torch.cat(self.entropy).mean(dim=0),
            entropy_input=mean(self.entropy_input),
            norm_ratio_input=mean(self.ratio_input),
            mixing=torch.cat(self.mixing).mean(dim=0) if self.mixing else None,
            position=self.position,
            rho=self.rho,
        )


def largest_step(values: Sequence[float], start: float | None, rise: bool) -> int | None:
    """The layer l whose value rises (``rise=False``: falls) most from layer l − 1's (``start`` before layer 0, unless
    None); None when nothing moves that way (a NaN step never does)."""
    previous = [start] + list(values[:-1])
    sign = 1.0 if rise else -1.0
    steps = [(s, l) for l, (v, p) in enumerate(zip(values, previous)) if p is not None and (s := sign * (v - p)) > 0]
    return max(steps)[1] if steps else None
