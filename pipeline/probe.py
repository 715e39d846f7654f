"""Sink metrics of a model on a probe set: ``run_probe`` (contracts.md, section 3).

``SinkAccumulator`` turns per-batch model outputs (attention maps of every layer, hidden
states, optionally keys/values and head outputs) into one :class:`SinkReport`; ``run_probe``
feeds it from a SinkLab ``Transformer`` and ``pipeline.analysis.hf_capture`` feeds it from a
Hugging Face model, so both paths count sinks the same way. Torch only, beside
``pipeline.metrics``: the training callbacks and the analysis layer both use it, and the
training layer imports nothing from ``pipeline.analysis`` for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

import numpy as np
import torch
from torch import Tensor

from pipeline import metrics
from pipeline.flow import FlowAccumulator, probe_batches, recording_inputs
from pipeline.model.attention_ops import SCORE_KINDS
from pipeline.model.masks import admitted_with_slots
from pipeline.outliers import OutlierAccumulator, recording_linear_inputs
from pipeline.sink_report import SinkReport

ATTENTION_KINDS = tuple(SCORE_KINDS)


class SinkAccumulator:
    """Collects per-sequence importances over batches; :meth:`report` forms the rates."""

    def __init__(
        self,
        eps: float = metrics.DEFAULT_EPS,
        positions: int = 10,
        outliers: OutlierAccumulator | None = None,
        flow: FlowAccumulator | None = None,
    ) -> None:
        self.eps, self.positions = eps, positions
        self.outliers = outliers  # fed the hidden states here; linear inputs come from hooks
        self.flow = flow  # fed by the caller, which runs the perturbed pass
        self.alphas: list[Tensor] = []  # [B, L, H, P]
        self.slots: list[Tensor] = []  # [B, L, H, S]
        self.massive: list[Tensor] = []  # [B, L]
        self.slot_massive: list[Tensor] = []  # [B, L, Q]
        self.key_ratio: list[Tensor] = []  # [B, L]
        self.value_ratio: list[Tensor] = []  # [B, L]
        self.qk: list[Tensor] = []  # [L, 4] per batch, weighted by batch size
        self.qk_weights: list[int] = []
        self.entropy: list[Tensor] = []  # [B, L, H]
        self.out_norm: list[Tensor] = []  # [B, L, H]
        self.bos_trigger: list[Tensor] = []  # [B, L, H]
        self.bos_other: list[Tensor] = []  # [B, L, H]
        self.max_logit: list[Tensor] = []  # [B, L, H]
        self.kinds: set[str] = set()
        self.seq_len = 0

    def add(
        self,
        attentions: Sequence[Tensor],
        attention_kind: str = "probs",
        n_query_slots: int = 0,
        n_key_slots: int = 0,
        hidden_states: Sequence[Tensor] | None = None,
        keys: Sequence[Tensor] | None = None,
        values: Sequence[Tensor] | None = None,
        queries: Sequence[Tensor] | None = None,
        head_outputs: Sequence[Tensor] | None = None,
        admitted: Tensor | None = None,
        trigger_queries: Tensor | None = None,
        max_logits: Sequence[Tensor] | None = None,  # per layer [B, H] (metrics.max_attention_logit)
    ) -> None:
        """One batch. ``attentions``/``hidden_states`` hold every layer, including the slot
        rows/columns, and ``admitted`` (bool, the maps' last two dims) what each row may see
        (default: causal, slot columns seen by all); ``queries``/``keys``/``values`` and
        ``head_outputs`` ([B, H, T, dh]) are real tokens only. ``trigger_queries`` [B, T] (bool,
        real tokens) marks the trigger positions of a Bigram-Backcopy probe."""
        if attention_kind not in ATTENTION_KINDS:
            raise ValueError(f"attention_kind {attention_kind!r}; expected one of {ATTENTION_KINDS}")
        if not attentions:
            raise ValueError("the model returned no attention maps (output_attentions ignored?)")
        self.kinds.add(attention_kind)
        alphas, slots, entropies, shares = [], [], [], []
        for layer_attn in attentions:
            a = layer_attn.detach().float()
            if attention_kind != "probs":
                a = metrics.proxy_scores(a, signed=attention_kind == "sim_signed")
            slot_mass, real = metrics.split_slots(a, n_query_slots, n_key_slots)
            alphas.append(metrics.importance_profile(real, self.positions))
            if trigger_queries is not None:
                shares.append(
                    (metrics.first_key_share(real, trigger_queries), metrics.first_key_share(real, ~trigger_queries))
                )
            slots.append(metrics.slot_importance(slot_mass))
            entropies.append(
                metrics.attention_entropy(
                    a[..., n_query_slots:, :], None if admitted is None else admitted[n_query_slots:]
                )
            )
        self.seq_len = real.shape[-1]
        self.entropy.append(torch.stack(entropies, dim=1).cpu())
        if head_outputs:
            self.out_norm.append(torch.stack([metrics.head_output_norm(o.detach()) for o in head_outputs], 1).cpu())
        self.alphas.append(torch.stack(alphas, dim=1).cpu())
        if shares:
            self.bos_trigger.append(torch.stack([t for t, _ in shares], dim=1).cpu())
            self.bos_other.append(torch.stack([o for _, o in shares], dim=1).cpu())
        self.slots.append(torch.stack(slots, dim=1).cpu())
        if max_logits:
            self.max_logit.append(torch.stack([m.detach().float() for m in max_logits], dim=1).cpu())
        if hidden_states and self.outliers is not None:
            self.outliers.add_hidden(hidden_states)
        if hidden_states:
            real_h = [h.detach().float()[:, n_query_slots:] for h in hidden_states]
            self.massive.append(torch.stack([metrics.massive_activation_ratio(h) for h in real_h], 1).cpu())
            if n_query_slots:
                ratios = [
                    h.detach().float()[:, :n_query_slots].norm(dim=-1) / r.norm(dim=-1).mean(dim=-1, keepdim=True)
                    for h, r in zip(hidden_states, real_h)
                ]
                self.slot_massive.append(torch.stack(ratios, dim=1).cpu())
        for source, sink in ((keys, self.key_ratio), (values, self.value_ratio)):
            if source:
                per_layer = [metrics.first_token_norm_ratio(x.detach().float()).mean(dim=1) for x in source]
                sink.append(torch.stack(per_layer, dim=1).cpu())
        if queries and keys:
            rows = []
            for q, k in zip(queries, keys):
                cos, normprod = metrics.qk_decomposition(q.detach().float(), k.detach().float())
                rows.append([*metrics.first_key_vs_rest(cos), *metrics.first_key_vs_rest(normprod)])
            self.qk.append(torch.tensor(rows) * queries[0].shape[0])
            self.qk_weights.append(queries[0].shape[0])

    def report(self) -> SinkReport:
        if not self.alphas:
            raise ValueError("no batches were added to the sink accumulator")
        alphas = torch.cat(self.alphas)  # [N, L, H, P]
        slots = torch.cat(self.slots)  # [N, L, H, S]
        n_layers = alphas.shape[1]
        cat_mean = lambda xs: torch.cat(xs).mean(dim=0) if xs else None  # noqa: E731
        cat_nanmean = lambda xs: torch.cat(xs).nanmean(dim=0) if xs else None  # noqa: E731
        massive = cat_mean(self.massive)
        return SinkReport(
            sink1=metrics.sink_rate(alphas[..., 0], self.eps),
            sink_star={str(s): metrics.sink_rate(slots[..., s], self.eps) for s in range(slots.shape[-1])},
            profile=[metrics.sink_rate(alphas[..., p], self.eps) for p in range(alphas.shape[-1])],
            alpha_profile=alphas.mean(dim=(0, 1, 2)).tolist(),
            alpha1=alphas[..., 0].mean(dim=0),
            massive_ratio=massive if massive is not None else torch.full((n_layers,), float("nan")),
            is_proxy=any(k != "probs" for k in self.kinds),
            eps=self.eps,
            n_sequences=alphas.shape[0],
            seq_len=self.seq_len,
            key_norm_ratio=cat_mean(self.key_ratio),
            value_norm_ratio=cat_mean(self.value_ratio),
            slot_massive_ratio=cat_mean(self.slot_massive),
            qk_decomposition=torch.stack(self.qk).sum(0) / sum(self.qk_weights) if self.qk else None,
            alpha1_all=alphas[..., 0],
            entropy=torch.cat(self.entropy).nanmean(dim=0),
            out_norm=cat_mean(self.out_norm),
            outliers=None if self.outliers is None else self.outliers.report(),
            bos_share_trigger=cat_nanmean(self.bos_trigger),
            bos_share_other=cat_nanmean(self.bos_other),
            max_logit=torch.cat(self.max_logit).amax(dim=0) if self.max_logit else None,
            flow=None if self.flow is None or not self.flow.entropy else self.flow.report(),
        )


def as_token_tensor(tokens, device: torch.device | str = "cpu") -> Tensor:
    """``tokens`` (tensor, numpy array or nested lists) of shape [N, T] -> LongTensor."""
    if isinstance(tokens, np.ndarray):
        tokens = torch.from_numpy(tokens.astype(np.int64, copy=False))
    tokens = torch.as_tensor(tokens, dtype=torch.long, device=device)
    if tokens.dim() != 2 or tokens.shape[1] < 2:
        raise ValueError(f"probe tokens must have shape [N, T] with T >= 2, got {tuple(tokens.shape)}")
    return tokens


def _device_of(model: torch.nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def _linear_inputs(model: torch.nn.Module, acc: OutlierAccumulator | None):
    """Record the linear-layer inputs of the model's blocks into ``acc`` (None: nothing)."""
    return recording_linear_inputs(model.blocks, acc) if acc is not None else nullcontext()


def run_probe(
    model: torch.nn.Module,
    tokens,
    eps: float = metrics.DEFAULT_EPS,
    positions: int = 10,
    batch_size: int = 25,
    output_qkv: bool = False,
    outliers: bool = True,
    trigger_ids: Sequence[int] | None = None,
    flow: bool = True,
    mixing_sequences: int | None = None,
) -> SinkReport:
    """Sink metrics of a SinkLab ``Transformer`` on ``tokens [N, T]`` (every sequence counted).

    Eval mode, no grad, autocast off (maps in fp32); the model's training mode is restored.
    Always the largest pre-softmax logit per head over the admitted real-token pairs; ``output_qkv``
    also the key/value norm ratio of the first token and the QK decomposition; ``outliers`` the
    activation outliers (pipeline.outliers) of the residual stream and every linear layer's input;
    ``flow`` the information flow (pipeline.flow: one more forward pass, on the first
    ``mixing_sequences`` sequences only where given). ``trigger_ids`` (a Bigram-Backcopy dataset's)
    split the attention on token 1 by query kind.
    """
    device = _device_of(model)
    tokens = as_token_tensor(tokens, device)
    admitted = admitted_with_slots(model.config, tokens.shape[1])  # the maps' mask pattern (windows, prefixes, slots)
    lead = model.config.sink_tokens + 1
    acc = SinkAccumulator(
        eps,
        positions,
        OutlierAccumulator(lead) if outliers else None,
        FlowAccumulator(mixing_sequences=mixing_sequences) if flow else None,
    )
    triggers = None if trigger_ids is None else torch.as_tensor(list(trigger_ids), dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(device_type=device.type, enabled=False):
            for start, stop in probe_batches(tokens.shape[0], batch_size, mixing_sequences if flow else None):
                kwargs = {"output_attentions": True, "output_hidden_states": True}
                batch = tokens[start:stop]
                with _linear_inputs(model, acc.outliers), recording_inputs(model, acc.flow) as embedded:
                    out = model(batch, **kwargs, output_qkv=True)  # queries and keys for the max logit
                real = admitted[-batch.shape[1] :, -batch.shape[1] :]  # slots and sink tokens left out
                logits = [metrics.max_attention_logit(q, k, real) for q, k in zip(out.queries or [], out.keys or [])]
                acc.add(
                    out.attentions,
                    attention_kind=out.attention_kind,
                    n_query_slots=out.n_query_slots,
                    n_key_slots=out.n_key_slots,
                    hidden_states=out.hidden_states,
                    keys=out.keys if output_qkv else None,
                    values=out.values if output_qkv else None,
                    queries=out.queries if output_qkv else None,
                    head_outputs=out.head_outputs,
                    admitted=admitted,
                    trigger_queries=None if triggers is None else torch.isin(batch, triggers),
                    max_logits=logits,
                )
                if acc.flow is not None:  # the same path again, so the untouched positions match exactly
                    perturbed = lambda: model(batch, **kwargs).hidden_states  # noqa: B023, E731
                    acc.flow.add_pass(model, out.hidden_states, perturbed, embedded, batch.shape[1])
    finally:
        model.train(was_training)
    return acc.report()
