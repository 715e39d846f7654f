"""Float64 conformance of the key slots (sink logit, K/KV biases): what the model computes (the slot
columns concatenated to the token logits, then one softmax) equals the log-sum-exp renormalisation
that fused kernels use (softmax over the tokens alone, then rescaled by exp(lse_tokens - lse_all)
and the slots' values added), under a sliding window, on the full sequence and when decoding one
token at a time on the cache. A wrong sink formula would differ here by far more than rounding."""

import math

import pytest
import torch

from pipeline.model import ModelConfig, StreamingCache, Transformer

T = 12
SLOTS = {
    "sink_logit": {"attention": {"sink_logit": True}},
    "off_by_one": {"attention": {"op": "softmax_off_by_one"}},
    "kv": {"biases": {"kind": "kv"}},
    "k_fixed_value": {"biases": {"kind": "k", "value_norm": 3.0, "key_dims": 4}},
    "kv_and_sink_logit": {"biases": {"kind": "kv", "shared_heads": True}, "attention": {"sink_logit": True}},
}


def _model(overrides: dict) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig.from_preset("micro", init_std=0.2, mask="sliding", window=5, **overrides)
    model = Transformer(cfg).double().eval()
    with torch.no_grad():  # slots that take a real share of attention
        for name, p in model.named_parameters():
            if name.endswith("sink_logit") or "kv_slot" in name:
                p.copy_(2.0 * torch.randn_like(p) + 1.0)
    return model


def renormalised(model: Transformer, layer: int, q, k, v) -> tuple[torch.Tensor, torch.Tensor]:
    """Each head's output by log-sum-exp renormalisation, and the share of attention the slots take."""
    attn, cfg = model.blocks[layer].attn, model.config
    B, H, n, dh = q.shape
    i = torch.arange(n)
    mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < cfg.window)
    s = (q @ k.transpose(-2, -1) / math.sqrt(dh)).masked_fill(~mask, float("-inf"))
    lse_tokens, out_tokens = s.logsumexp(-1, keepdim=True), torch.softmax(s, -1) @ v
    slot_logits, slot_values = [], []
    if attn.kv_slot is not None:
        k_star, v_star = attn.kv_slot.keys_values(B, H)
        slot_logits.append(q @ k_star.transpose(-2, -1) / math.sqrt(dh))
        slot_values.append(v_star)
    if cfg.has_sink_logit:  # one more logit (learned, or 0 for softmax-off-by-one) whose value is zero
        logit = attn.sink_logit if attn.sink_logit is not None else torch.zeros(H, dtype=q.dtype)
        slot_logits.append(logit[None, :, None, None].expand(B, H, n, 1))
        slot_values.append(torch.zeros(B, H, 1, dh, dtype=q.dtype))
    lse_all = torch.cat([lse_tokens, *slot_logits], -1).logsumexp(-1, keepdim=True)
    out = torch.exp(lse_tokens - lse_all) * out_tokens
    for logit, value in zip(slot_logits, slot_values):
        out = out + torch.exp(logit - lse_all) * value
    return out, 1 - torch.exp(lse_tokens - lse_all)


@pytest.mark.parametrize("name", SLOTS)
def test_concat_then_softmax_is_the_log_sum_exp_renormalisation(name):
    model = _model(SLOTS[name])
    idx = torch.randint(0, 64, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx, output_attentions=True, output_qkv=True)
        cache = StreamingCache(model.config, n_initial=0, n_recent=T)
        steps = [model(idx[:, t : t + 1], cache=cache, output_attentions=True) for t in range(T)]
    for layer in range(model.config.n_layers):
        q, k, v = full.queries[layer], full.keys[layer], full.values[layer]
        expected, slot_share = renormalised(model, layer, q, k, v)
        assert slot_share.mean() > 0.05  # the slots matter: leaving them out would fail below
        torch.testing.assert_close(full.head_outputs[layer], expected, atol=1e-12, rtol=1e-12)
        incremental = torch.cat([step.head_outputs[layer] for step in steps], dim=2)
        torch.testing.assert_close(incremental, expected, atol=1e-12, rtol=1e-12)
        without_slots = (
            torch.softmax(
                (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(
                    torch.ones(T, T, dtype=torch.bool).triu(1) | torch.ones(T, T, dtype=torch.bool).tril(-5), -torch.inf
                ),
                -1,
            )
            @ v
        )
        assert (without_slots - expected).abs().max() > 1e-3
    torch.testing.assert_close(torch.cat([s.logits for s in steps], 1), full.logits, atol=1e-12, rtol=1e-12)
