"""Sink metrics of a model on a probe set (contracts.md, section 3): ``SinkAccumulator`` turns per-batch outputs into
one :class:`SinkMeasures`, fed by ``run_probe`` (a SinkLab ``Transformer``) and ``pipeline.analysis.hf_capture``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from pipeline import metrics, probe_metrics
from pipeline.flow import FlowAccumulator, capturing_inputs, probe_batches
from pipeline.model.attention_ops import SCORE_KINDS
from pipeline.model.masks import admitted_with_extra
from pipeline.outliers import OutlierAccumulator, capturing_linear_inputs
from pipeline.probe_metrics import ProbeBatch
from pipeline.sink_measures import SinkMeasures

ATTENTION_KINDS = tuple(SCORE_KINDS)
# the fields of a model's output that SinkAccumulator.add reads
CAPTURED = ("attentions", "attention_kind", "n_extra_queries", "n_extra_keys", "hidden_states")
CAPTURED += ("queries", "keys", "values", "head_outputs")


class SinkAccumulator:
    """Collects per-sequence importances and the registered metrics over batches; :meth:`measures` forms the rates."""

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
        self.extra: list[Tensor] = []  # [B, L, H, S]: Sink_* inputs of each slot and sink token
        self.values: dict[str, list[Tensor]] = {}  # registered key -> [[B, L(, H)]]
        self.sink_token_massive: list[Tensor] = []  # [B, L, Q]
        self.qk: list[Tensor] = []  # [B, L, 4]: a batch's means, once for each of its sequences
        self.kinds: set[str] = set()
        self.seq_len = 0

    def add(
        self,
        attentions: Sequence[Tensor],
        attention_kind: str = "probs",
        n_extra_queries: int = 0,
        n_extra_keys: int = 0,
        hidden_states: Sequence[Tensor] | None = None,
        keys: Sequence[Tensor] | None = None,
        values: Sequence[Tensor] | None = None,
        queries: Sequence[Tensor] | None = None,
        head_outputs: Sequence[Tensor] | None = None,
        admitted: Tensor | None = None,
        trigger_queries: Tensor | None = None,
        qkv: bool = True,
        max_logit: bool = False,
    ) -> None:
        """One batch: ``attentions``/``hidden_states`` of every layer with the extra rows and columns, ``admitted`` what
        each row may see (default causal, extra columns seen by all); ``queries``/``keys``/``values``/``head_outputs``
        ([B, H, T, dh]) and ``trigger_queries`` ([B, T] bool, a Bigram-Backcopy probe's) real tokens only; ``qkv``
        measures the key/value norm ratios and QK decomposition, ``max_logit`` the largest q·k/√d_h."""
        if attention_kind not in ATTENTION_KINDS:
            raise ValueError(f"attention_kind {attention_kind!r}; expected one of {ATTENTION_KINDS}")
        if not attentions:
            raise ValueError("the model returned no attention maps (output_attentions ignored?)")
        self.kinds.add(attention_kind)
        if admitted is None:
            admitted = metrics.causal_admitted(*attentions[0].shape[-2:], attentions[0].device)
        alphas, extra, measured = [], [], []
        for l, a in enumerate(attentions):  # one layer at a time: its tensors stay in cache
            one = lambda xs: None if not xs else xs[l].detach().float()[:, None]  # noqa: B023, E731
            maps = a.detach()[:, None, :, n_extra_queries:].float()  # [B, 1, H, T, S + T]
            if attention_kind != "probs":
                maps = metrics.proxy_scores(maps, signed=attention_kind == "sim_signed")
            hidden = one(hidden_states)
            batch = ProbeBatch(
                maps=maps,
                admitted=admitted[n_extra_queries:].to(maps.device),
                n_extra_keys=n_extra_keys,
                hidden=None if hidden is None else hidden[:, :, n_extra_queries:],
                queries=one(queries),
                keys=one(keys),
                values=one(values),
                head_outputs=one(head_outputs),
                triggers=trigger_queries,
                qkv=qkv,
                logits=max_logit,
            )
            extra_mass, real = metrics.split_extra(maps, 0, n_extra_keys)
            alphas.append(metrics.importance_profile(real, self.positions))
            extra.append(metrics.extra_importance(extra_mass))
            measured.append(probe_metrics.measure(batch))
        self.seq_len = real.shape[-1]
        self.alphas.append(torch.cat(alphas, dim=1).cpu())
        self.extra.append(torch.cat(extra, dim=1).cpu())
        for key in measured[0]:
            self.values.setdefault(key, []).append(torch.cat([m[key] for m in measured], dim=1))
        if hidden_states and self.outliers is not None:
            self.outliers.add_hidden(hidden_states)
        if hidden_states and n_extra_queries:
            norms = [h.detach().float().norm(dim=-1) for h in hidden_states]
            ratios = [n[:, :n_extra_queries] / n[:, n_extra_queries:].mean(dim=-1, keepdim=True) for n in norms]
            self.sink_token_massive.append(torch.stack(ratios, dim=1).cpu())
        if qkv and queries and keys:
            pairs = (metrics.qk_decomposition(q.detach().float(), k.detach().float()) for q, k in zip(queries, keys))
            rows = [[*metrics.first_key_vs_rest(cos), *metrics.first_key_vs_rest(norm)] for cos, norm in pairs]
            self.qk.append(torch.tensor(rows).expand(queries[0].shape[0], -1, -1))

    def measures(self) -> SinkMeasures:
        if not self.alphas:
            raise ValueError("no batches were added to the sink accumulator")
        alphas = torch.cat(self.alphas)  # [N, L, H, P]
        extra = torch.cat(self.extra)  # [N, L, H, S]
        values = probe_metrics.reduced(self.values)
        for key, m in probe_metrics.REGISTRY.items():
            if m.nan_when_unmeasured:
                values.setdefault(key, torch.full(alphas.shape[1 : 2 if m.per == "layer" else 3], float("nan")))
        return SinkMeasures(
            sink1=metrics.sink_rate(alphas[..., 0], self.eps),
            sink_star={str(s): metrics.sink_rate(extra[..., s], self.eps) for s in range(extra.shape[-1])},
            profile=[metrics.sink_rate(alphas[..., p], self.eps) for p in range(alphas.shape[-1])],
            alpha_profile=alphas.mean(dim=(0, 1, 2)).tolist(),
            alpha1=alphas[..., 0].mean(dim=0),
            values=values,
            is_proxy=any(k != "probs" for k in self.kinds),
            eps=self.eps,
            n_sequences=alphas.shape[0],
            seq_len=self.seq_len,
            sink_token_massive_ratio=torch.cat(self.sink_token_massive).mean(dim=0)
            if self.sink_token_massive
            else None,
            qk_decomposition=torch.cat(self.qk).mean(dim=0) if self.qk else None,
            alpha1_all=alphas[..., 0],
            outliers=None if self.outliers is None else self.outliers.measures(),
            flow=None if self.flow is None or not self.flow.entropy else self.flow.measures(),
        )


def as_token_tensor(tokens, device: torch.device | str = "cpu") -> Tensor:
    """``tokens`` (tensor, numpy array or nested lists) of shape [N, T] -> LongTensor."""
    tokens = torch.as_tensor(tokens, dtype=torch.long, device=device)
    if tokens.dim() != 2 or tokens.shape[1] < 2:
        raise ValueError(f"probe tokens must have shape [N, T] with T >= 2, got {tuple(tokens.shape)}")
    return tokens


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
) -> SinkMeasures:
    """Sink metrics of a SinkLab ``Transformer`` on ``tokens [N, T]`` (docs/analysis.md: `run_probe`)."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    tokens = as_token_tensor(tokens, device)
    # the maps' mask pattern (windows, prefixes, extra columns)
    admitted = admitted_with_extra(model.config, tokens.shape[1])
    acc = SinkAccumulator(
        eps,
        positions,
        OutlierAccumulator(model.config.sink_tokens + 1) if outliers else None,  # the sink tokens and the first
        FlowAccumulator(mixing_sequences=mixing_sequences) if flow else None,
    )
    triggers = None if trigger_ids is None else torch.as_tensor(list(trigger_ids), dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(device_type=device.type, enabled=False):
            for start, stop in probe_batches(tokens.shape[0], batch_size, mixing_sequences if flow else None):
                # no logits (skip_head): the probe reads none, and the LM head is a third of a small model's forward
                kwargs = {"output_attentions": True, "output_hidden_states": True, "skip_head": True}
                batch = tokens[start:stop]
                with capturing_linear_inputs(model.blocks, acc.outliers), capturing_inputs(model, acc.flow) as embedded:
                    out = model(batch, **kwargs, output_qkv=True)  # queries and keys for the max logit
                acc.add(
                    **{name: getattr(out, name) for name in CAPTURED},
                    admitted=admitted,
                    trigger_queries=None if triggers is None else torch.isin(batch, triggers),
                    qkv=output_qkv,
                    max_logit=True,
                )
                if acc.flow is not None:  # the same path again, so the untouched positions match exactly
                    perturbed = lambda: model(batch, **kwargs).hidden_states  # noqa: B023, E731
                    acc.flow.add_pass(model, out.hidden_states, perturbed, embedded, batch.shape[1])
    finally:
        model.train(was_training)
    return acc.measures()
