"""Attention biases, masks, sink tokens and operations checked against hand computation."""

import math

import pytest
import torch
import torch.nn.functional as F

from pipeline.model import ModelConfig, Transformer
from pipeline.model.attention_ops import OPS, SCORE_KINDS, build_feature_map
from pipeline.model.positional import apply_rotary


def _model(seed=0, **overrides):
    torch.manual_seed(seed)
    return Transformer(ModelConfig.from_preset("micro", init_std=0.2, **overrides)).eval()


def _layer0_qkv(model, idx):
    """Unrotated per-head q, k, v of layer 0 (they depend only on each token itself)."""
    attn = model.blocks[0].attn
    x = model.blocks[0].attn_norm(model.embed(idx))
    B, T, _ = x.shape
    q, k, v = attn.qkv(x).view(B, T, 3, attn.n_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    return q, k, v


def _layer0_output_before_merge(model, idx):
    """Run layer 0's attention and capture the per-head output before W_O."""
    captured = {}
    handle = model.blocks[0].attn.out.register_forward_hook(lambda m, i, o: captured.setdefault("y", i[0]))
    model(idx)
    handle.remove()
    return captured["y"]


# ---- biases (Tables 4, 5, 13) -------------------------------------------------------------


def test_k_bias_with_zero_value_changes_scores_but_adds_nothing_to_values():
    m = _model(positional="nope", biases={"kind": "k"})
    idx = torch.randint(0, 64, (1, 6))
    with torch.no_grad():
        m.blocks[0].attn.kv_slot.key.normal_(0, 2.0)
    out = m(idx, output_attentions=True)
    attn = out.attentions[0][0]  # [H, T, 1 + T]
    assert out.n_extra_keys == 1 and torch.all(attn[:, :, 0] > 0.01)
    q, k, v = _layer0_qkv(m, idx)
    kstar = m.blocks[0].attn.kv_slot.key[:, None, :]  # [H, 1, dh]
    scores = torch.cat([q[0] @ kstar.transpose(-1, -2), q[0] @ k[0].transpose(-1, -2)], -1) / math.sqrt(q.shape[-1])
    scores[:, :, 1:] += torch.triu(torch.full((6, 6), float("-inf")), 1)
    torch.testing.assert_close(attn, torch.softmax(scores, -1), atol=1e-6, rtol=1e-5)
    y = _layer0_output_before_merge(m, idx).view(1, 6, 2, -1).transpose(1, 2)[0]
    torch.testing.assert_close(y, attn[:, :, 1:] @ v[0], atol=1e-6, rtol=1e-5)  # v* = 0 adds nothing


def test_fixed_value_bias_is_m_times_direction():
    for direction, first in (("onehot", 5.0), ("uniform", 5.0 / math.sqrt(16))):
        m = _model(biases={"kind": "k", "value_norm": 5.0, "value_direction": direction})
        value = m.blocks[0].attn.kv_slot.value
        assert value.norm(dim=-1).allclose(torch.tensor(5.0)) and value[0, 0].item() == pytest.approx(first)
        assert "blocks.0.attn.kv_slot.value" not in dict(m.named_parameters())


def test_key_dims_only_first_da_dims_are_learnable():
    m = _model(biases={"kind": "k", "key_dims": 3})
    key, _ = m.blocks[0].attn.kv_slot.keys_values(1, 2)
    assert m.blocks[0].attn.kv_slot.key.shape == (2, 3)
    assert torch.all(key[..., 3:] == 0) and torch.all(key[..., :3] != 0)


def test_v_bias_adds_vstar_to_every_output():
    m = _model(biases={"kind": "v"})
    idx = torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        m.blocks[0].attn.value_bias.zero_()
        base = _layer0_output_before_merge(m, idx)
        m.blocks[0].attn.value_bias.normal_()
        shifted = _layer0_output_before_merge(m, idx)
    vstar = m.blocks[0].attn.value_bias.detach().reshape(-1)  # heads concatenated
    torch.testing.assert_close(shifted - base, vstar.expand_as(base), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kind", ["kv", "k", "v"])
def test_head_shared_biases_have_one_vector(kind):
    m = _model(biases={"kind": kind, "shared_heads": True})
    attn = m.blocks[0].attn
    param = attn.value_bias if kind == "v" else attn.kv_slot.key
    assert param.shape[0] == 1


# ---- sink tokens (Xiao et al. 2024) ---------------------------------------------------------


@pytest.mark.parametrize("n_sinks", [1, 2])
def test_sink_tokens_shift_every_real_position_by_their_count(n_sinks):
    m = _model(sink_tokens=n_sinks)
    idx = torch.randint(0, 64, (1, 7))
    out = m(idx, output_qkv=True, output_attentions=True)
    _, k, _ = _layer0_qkv(m, idx)
    cos, sin = m.positional.rotary(torch.arange(n_sinks, n_sinks + 7))
    torch.testing.assert_close(out.keys[0], apply_rotary(k, cos, sin), atol=1e-6, rtol=1e-5)
    assert out.logits.shape == (1, 7, 64)  # never predicted
    assert (out.n_extra_queries, out.n_extra_keys) == (n_sinks, n_sinks)
    assert out.attentions[0].shape[-2:] == (7 + n_sinks, 7 + n_sinks)


def test_sink_token_logits_equal_a_model_fed_the_sink_embedding_as_a_token():
    m = _model(sink_tokens=1)
    plain = Transformer(m.config.replace(sink_tokens=0)).eval()
    plain.load_state_dict({k: v for k, v in m.state_dict().items() if k != "sink_tokens"})
    with torch.no_grad():
        plain.embed.weight[0] = m.sink_tokens[0]
    idx = torch.randint(1, 64, (1, 6))
    expected = plain(torch.cat([torch.zeros(1, 1, dtype=torch.long), idx], 1)).logits[:, 1:]
    torch.testing.assert_close(m(idx).logits, expected, atol=1e-5, rtol=1e-5)


# ---- masks (section 6) ----------------------------------------------------------------------


def _brute_force(mask, T, p=0, w=0):
    allowed = torch.zeros(T, T, dtype=torch.bool)
    for i in range(T):
        for j in range(T):
            if mask == "causal":
                allowed[i, j] = j <= i
            elif mask == "prefix":
                allowed[i, j] = j <= i or (i < p and j < p)
            else:
                allowed[i, j] = j <= i and j >= i - w + 1
    return allowed


@pytest.mark.parametrize("mask, extra", [("causal", {}), ("prefix", {"prefix_len": 4}), ("sliding", {"window": 3})])
@pytest.mark.parametrize("op", ["softmax", "sigmoid"])
def test_each_mask_admits_exactly_its_pairs(mask, extra, op):
    T = 9
    m = _model(mask=mask, attention={"op": op, "normalizer": "sum"}, **extra)
    out = m(torch.randint(0, 64, (1, T)), output_attentions=True)
    expected = _brute_force(mask, T, extra.get("prefix_len", 0), extra.get("window", 0))
    for attn in out.attentions:
        assert torch.equal(attn[0] != 0, expected.expand_as(attn[0]))


def test_prefix_lm_changes_prefix_rows_only_through_the_prefix():
    m = _model(mask="prefix", prefix_len=3)
    idx = torch.randint(0, 64, (1, 8))
    changed = idx.clone()
    changed[0, 2] = (idx[0, 2] + 1) % 64
    a, b = m(idx).logits, m(changed).logits
    assert not torch.allclose(a[0, 0], b[0, 0])  # bidirectional inside the prefix
    changed_after = idx.clone()
    changed_after[0, 5] = (idx[0, 5] + 1) % 64
    torch.testing.assert_close(m(changed_after).logits[0, :5], a[0, :5])  # still causal after it


# ---- SDPA path == eager probability path -----------------------------------------------------

SOFTMAX_VARIANTS = [
    {},
    dict(positional="alibi"),
    dict(positional="relative"),
    dict(positional="t5"),
    dict(positional="nope"),
    dict(positional="learned"),
    dict(positional="sinusoidal"),
    dict(norm_position="post"),
    dict(head_merge="sum"),
    dict(norm="layernorm"),
    dict(norm="layernorm", norm_position="post"),
    dict(mask="prefix", prefix_len=3),
    dict(mask="sliding", window=3),
    dict(biases={"kind": "kv"}),
    dict(biases={"kind": "k", "value_norm": 3.0}),
    dict(biases={"kind": "v"}),
    dict(biases={"kind": "kv", "shared_heads": True}),
    dict(sink_tokens=2),
    dict(attention={"alpha": 0.2}),
    dict(attention={"op": "softmax_off_by_one"}),
    dict(attention={"sink_logit": True}),
    dict(attention={"gated": True, "qk_norm": True}),
    dict(attention={"gated": True, "gate_granularity": "elementwise"}, head_merge="sum"),
    dict(biases={"kind": "kv", "slot_logit": True}, attention={"sink_logit": True}, n_kv_heads=1),
    dict(
        sink_tokens=1,
        biases={"kind": "kv"},
        attention={"sink_logit": True},
        positional="alibi",
        mask="sliding",
        window=4,
    ),
]


@pytest.mark.parametrize("overrides", SOFTMAX_VARIANTS, ids=lambda o: str(o) or "default")
def test_sdpa_path_equals_eager_probability_path(overrides):
    m = _model(**overrides)
    for name, p in m.named_parameters():
        if name.endswith(("sink_logit", "slot_logit")):
            torch.nn.init.normal_(p, 0.0, 1.0)
    idx = torch.randint(0, 64, (2, 11))
    fast = m(idx).logits
    slow = m(idx, output_attentions=True)
    torch.testing.assert_close(fast, slow.logits, atol=2e-5, rtol=1e-5)
    assert slow.attention_kind == "probs"
    for attn in slow.attentions:  # rows, slots included, sum to one
        torch.testing.assert_close(attn.sum(-1), torch.ones(attn.shape[:-1]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("granularity", ["headwise", "elementwise"])
def test_gate_multiplies_each_heads_output_by_sigmoid_of_its_input_times_w(granularity):
    """Qiu et al.'s G1: after SDPA, y <- y * sigma(x W) with x the attention's input, one score per
    head (W: d x H) or per head-dimension element (W_g: d x d), before W_O."""
    m = _model(positional="nope", attention={"gated": True, "gate_granularity": granularity})
    idx = torch.randint(0, 64, (2, 9))
    q, k, v = _layer0_qkv(m, idx)
    B, H, T, dh = q.shape
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    y = torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(dh)).masked_fill(~causal, -math.inf), -1) @ v
    w = m.blocks[0].attn.gate.weight
    assert w.shape == (H if granularity == "headwise" else H * dh, H * dh)
    gate = torch.sigmoid(m.blocks[0].attn_norm(m.embed(idx)) @ w.T)  # [B, T, H] or [B, T, d]
    gate = gate[..., None] if granularity == "headwise" else gate.view(B, T, H, dh)
    expected = (y.transpose(1, 2) * gate).reshape(B, T, H * dh)
    torch.testing.assert_close(_layer0_output_before_merge(m, idx), expected, atol=1e-5, rtol=1e-5)


def test_layernorm_choice_reaches_every_norm():
    m = _model(norm="layernorm")
    norms = [m.norm] + [n for b in m.blocks for n in (b.attn_norm, b.ffn_norm)]
    assert all(type(n) is torch.nn.LayerNorm for n in norms)
    assert all(
        torch.equal(n.weight, torch.ones_like(n.weight)) and torch.equal(n.bias, torch.zeros_like(n.bias))
        for n in norms
    )
    assert all(type(n) is torch.nn.RMSNorm for n in (_model().norm, _model().blocks[0].attn_norm))


def test_softmax_off_by_one_formula():
    m = _model(attention={"op": "softmax_off_by_one"}, positional="nope")
    idx = torch.randint(0, 64, (1, 5))
    out = m(idx, output_attentions=True)
    q, k, _ = _layer0_qkv(m, idx)
    s = (q[0] @ k[0].transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(
        torch.triu(torch.ones(5, 5, dtype=torch.bool), 1), float("-inf")
    )
    expected = s.exp() / (1 + s.exp().sum(-1, keepdim=True))
    torch.testing.assert_close(out.attentions[0][0, :, :, 1:], expected, atol=1e-6, rtol=1e-5)


# ---- eager operations: formulas and gradients ------------------------------------------------


def _qkvm(T=5, dh=4, slots=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, T, dh, generator=g, dtype=torch.float64)
    k = torch.randn(1, 2, T + slots, dh, generator=g, dtype=torch.float64)
    v = torch.randn(1, 2, T + slots, dh, generator=g, dtype=torch.float64)
    mask = torch.zeros(1, 1, T, T + slots, dtype=torch.float64)
    mask[..., slots:] = torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), 1)
    return q, k, v, mask


OP_CONFIGS = [
    dict(op="softmax"),
    dict(op="softmax", p=0.5),
    dict(op="softmax", alpha=0.2),
    dict(op="clipped_softmax"),
    dict(op="sigmoid", normalizer="none"),
    dict(op="sigmoid", normalizer="sum"),
    dict(op="sigmoid", p=2.0),
    dict(op="sigmoid", normalizer="abs_clamp"),
    dict(op="elu1", normalizer="abs_clamp"),
    dict(op="elu1", normalizer="none"),
    dict(op="elu1", normalizer="sum"),
    dict(op="softmax_off_by_one"),
    dict(op="kernel", feature_map="identity", normalizer="none"),
    dict(op="kernel", feature_map="identity", normalizer="abs_clamp"),
    dict(op="kernel", feature_map="elu1", normalizer="sum"),
    dict(op="kernel", feature_map="elu1", normalizer="none"),
    dict(op="kernel", feature_map="mlp", normalizer="abs_clamp"),
    dict(op="kernel", feature_map="mlp", normalizer="none"),
    dict(op="softpick"),
    dict(op="relu"),
    dict(op="ssmax"),
]


def test_op_table_covers_every_registered_op_and_what_it_accepts():
    for name, spec in OPS.items():
        rows = [c for c in OP_CONFIGS if c["op"] == name]
        assert {c.get("normalizer", "sum") for c in rows} == set(spec.normalizers), name
        assert any(c.get("p", 1.0) != 1.0 for c in rows) == spec.p_norm, name


@pytest.mark.parametrize("acfg", OP_CONFIGS, ids=lambda a: "-".join(map(str, a.values())))
def test_every_operation_passes_gradcheck(acfg):
    a = ModelConfig.from_preset("micro", attention=acfg).attention
    phi = build_feature_map(a, 4)
    if phi is not None:
        phi.double()
    q, k, v, mask = _qkvm()
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    fn = lambda q, k, v: OPS[a.op].fn(q, k, mask, a, phi).weights @ v
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-5)


def test_sigmoid_and_elu_ops_by_hand():
    q, k, v, mask = _qkvm()
    s = q @ k.transpose(-1, -2) / 2.0 + mask
    causal = torch.isfinite(mask)
    for op, fn in (("sigmoid", torch.sigmoid), ("elu1", lambda x: F.elu(x) + 1)):
        sim = torch.where(causal, fn(s.nan_to_num(neginf=0)), torch.zeros_like(s))
        for normalizer, expected in (("none", sim), ("sum", sim / sim.sum(-1, keepdim=True))):
            a = ModelConfig.from_preset("micro", attention={"op": op, "normalizer": normalizer}).attention
            r = OPS[op].fn(q, k, mask, a, None)
            torch.testing.assert_close(r.weights, expected)
            torch.testing.assert_close(r.reported, sim)


def test_relu_op_divides_by_the_keys_each_query_sees():
    q, k, v, mask = _qkvm()
    s = (q @ k.transpose(-1, -2) / 2.0 + mask).nan_to_num(neginf=0.0)
    causal = torch.isfinite(mask)
    sim = torch.where(causal, s.clamp(min=0.0), torch.zeros_like(s))
    r = OPS["relu"].fn(q, k, mask, ModelConfig.from_preset("micro", attention={"op": "relu"}).attention, None)
    counts = torch.arange(1, s.shape[-1] + 1, dtype=s.dtype)[:, None]  # query i sees i keys
    torch.testing.assert_close(r.weights, sim / counts)
    torch.testing.assert_close(r.reported, sim)


def test_p_normalised_softmax_equals_eq43_directly():
    q, k, v, mask = _qkvm()
    for p in (0.5, 1 / 3, 2.0):
        a = ModelConfig.from_preset("micro", attention={"p": p}).attention
        sim = torch.exp(q @ k.transpose(-1, -2) / 2.0 + mask)
        expected = sim / sim.pow(p).sum(-1, keepdim=True).pow(1 / p)  # Eq. 43
        torch.testing.assert_close(OPS["softmax"].fn(q, k, mask, a, None).weights, expected)


def test_abs_clamp_normaliser_is_max_abs_sum_one():
    q, k, v, mask = _qkvm()
    a = ModelConfig.from_preset(
        "micro", attention={"op": "kernel", "feature_map": "identity", "normalizer": "abs_clamp"}
    ).attention
    r = OPS["kernel"].fn(q, k, mask, a, torch.nn.Identity())
    sim = torch.where(torch.isfinite(mask), q @ k.transpose(-1, -2) / 2.0, torch.zeros(()))
    torch.testing.assert_close(r.weights, sim / sim.sum(-1, keepdim=True).abs().clamp(min=1))
    assert OPS["kernel"].kind(a) == "sim_signed" and torch.any(r.reported < 0)


def test_clipped_softmax_formula():
    q, k, v, mask = _qkvm()
    a = ModelConfig.from_preset(
        "micro", attention={"op": "clipped_softmax", "clip_gamma": -0.1, "clip_zeta": 1.1}
    ).attention
    expected = (1.2 * torch.softmax(q @ k.transpose(-1, -2) / 2.0 + mask, -1) - 0.1).clamp(0, 1)
    torch.testing.assert_close(OPS["clipped_softmax"].fn(q, k, mask, a, None).weights, expected)


def test_softpick_by_hand():
    """x = q k + bias with d_h = 1: e^x - 1 = (2, 0, -0.5) gives (0.8, 0, 0); a masked key adds
    nothing; a row without a positive score is all zero; scores near 100 do not overflow fp32."""
    a = ModelConfig.from_preset("micro", attention={"op": "softpick"}).attention
    q, k = torch.ones(1, 1, 4, 1), torch.tensor([math.log(3), 0.0, math.log(0.5)]).view(1, 1, 3, 1)
    inf = float("inf")
    mask = torch.tensor([[0, 0, 0], [-inf, math.log(2), 0], [-inf, -inf, 0], [100, 100, 100]]).view(1, 1, 4, 3)
    w = OPS["softpick"].fn(q, k, mask, a, None).weights[0, 0]
    expected = torch.tensor([[0.8, 0, 0], [0, 2 / 3, 0], [0, 0, 0], [2 / 3, 2 / 9, 1 / 9]])
    torch.testing.assert_close(w, expected)
    assert torch.equal(w == 0, expected == 0)


@pytest.mark.parametrize(
    "acfg",
    [
        dict(op="sigmoid", normalizer="none"),
        dict(op="kernel", feature_map="mlp", normalizer="abs_clamp"),
        dict(op="elu1", normalizer="none"),
    ],
)
def test_non_softmax_models_overfit_a_tiny_batch(acfg):
    m = _model(attention=acfg)
    m.train()
    idx = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        logits = m(idx[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, 64), idx[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]


@pytest.mark.parametrize(
    "acfg",
    OP_CONFIGS + [dict(op="kernel", feature_map="elu1", normalizer="abs_clamp")],
    ids=lambda a: "-".join(map(str, a.values())),
)
def test_each_op_reports_what_its_entry_claims(acfg):
    """probs: the weights the model attends with, each row at most one unit of attention (the
    sink metrics read them as they are); sim_nonneg: no negative score (the metrics' proxy is
    sim / sum sim); sim_signed may be negative (|sim| / sum |sim|). Masked pairs report 0."""
    q, k, v, mask = _qkvm(slots=1)
    a = ModelConfig.from_preset("micro", attention=acfg).attention
    phi = build_feature_map(a, q.shape[-1])
    result = OPS[a.op].fn(q, k, mask, a, None if phi is None else phi.double())
    kind, reported = OPS[a.op].kind(a), result.reported
    assert kind in SCORE_KINDS
    if kind == "probs":
        assert torch.equal(reported, result.weights) and reported.sum(-1).max() <= 1 + 1e-12
    if kind != "sim_signed":
        assert reported.min() >= 0
    assert torch.all(reported[torch.isinf(mask).expand_as(reported)] == 0)


# ---- SSMax (Nakanishi 2025) -------------------------------------------------------------------


def test_ssmax_multiplies_each_rows_logits_by_s_log_n_by_hand():
    model = _model(positional="nope", attention={"op": "ssmax"}, biases={"kind": "kv"})
    attn = model.blocks[0].attn
    assert attn.length_scale.tolist() == pytest.approx([1 / math.log(64)] * 2)  # 1 / log(max_seq_len)
    with torch.no_grad():
        attn.length_scale.copy_(torch.tensor([0.3, 1.7]))
    idx = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(3))
    q, k, _ = _layer0_qkv(model, idx)
    slot_k, _ = attn.kv_slot.keys_values(1, 2)
    z = torch.cat([slot_k, k], 2).transpose(-1, -2)
    logits = (q @ z) / math.sqrt(attn.head_dim)  # [1, H, T, 1 + T]
    n = torch.arange(2, 8, dtype=torch.float32)  # row i sees the slot and tokens 1..i
    scaled = logits * attn.length_scale[None, :, None, None] * n.log()[None, None, :, None]
    causal = torch.ones(6, 7, dtype=torch.bool).tril(1)
    expected = torch.softmax(scaled.masked_fill(~causal, float("-inf")), -1)
    with torch.no_grad():
        got = model(idx, output_attentions=True).attentions[0]
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    plain = _model(positional="nope", biases={"kind": "kv"})  # the same weights under softmax differ
    with torch.no_grad():
        assert not torch.allclose(plain(idx, output_attentions=True).attentions[0], got, atol=1e-3)


@pytest.mark.parametrize("weights", [False, True], ids=["sdpa", "eager"])
def test_ssmax_length_scale_passes_gradcheck_on_both_paths(weights):
    model = _model(attention={"op": "ssmax"}).double()
    idx = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    name = "blocks.1.attn.length_scale"
    s_h = dict(model.named_parameters())[name].detach().clone().requires_grad_()
    fn = lambda s: torch.func.functional_call(model, {name: s}, (idx,), {"output_attentions": weights}).logits  # noqa: E731
    assert torch.autograd.gradcheck(fn, (s_h,), eps=1e-6, atol=1e-5)


# ---- grouped-query attention ----------------------------------------------------------------


def _full_heads_twin(model):
    """The same function with n_kv_heads = n_heads: each key/value head's rows repeated for its query heads."""
    cfg = model.config
    twin = Transformer(cfg.replace(n_kv_heads=None)).eval()
    sd, H, Hkv, dh, d = model.state_dict(), cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.d_model
    for key in list(sd):
        if key.endswith("attn.qkv.weight"):
            q, k, v = sd[key].split((d, Hkv * dh, Hkv * dh))
            k, v = (t.view(Hkv, dh, d).repeat_interleave(H // Hkv, 0).reshape(d, d) for t in (k, v))
            sd[key] = torch.cat((q, k, v))
        elif key.endswith(("kv_slot.key", "kv_slot.value")) and sd[key].shape[0] == Hkv:
            sd[key] = sd[key].repeat_interleave(H // Hkv, 0)
    twin.load_state_dict(sd)
    return twin


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"attention": {"sink_logit": True}},
        {"biases": {"kind": "kv"}},
        {"biases": {"kind": "k", "value_norm": 2.0, "slot_logit": True}, "attention": {"sink_logit": True}},
        {"attention": {"op": "softmax_off_by_one"}},
        {"positional": "alibi"},
        {"attention": {"op": "sigmoid"}},  # blocked kernels
        {"attention": {"op": "sigmoid"}, "biases": {"kind": "kv"}},
    ],
    ids=["plain", "sink-logit", "kv-slot", "k-slot+sink", "off-by-one", "alibi-mask", "sigmoid", "sigmoid-kv"],
)
def test_gqa_equals_full_heads_with_repeated_key_value_weights_on_every_path(overrides):
    model = _model(seed=3, d_model=48, n_heads=6, n_kv_heads=2, **overrides)
    for name, p in model.named_parameters():  # slots away from their zero init
        if "kv_slot" in name or name.endswith(("sink_logit", "slot_logit")):
            p.data.normal_(0.0, 0.5)
    twin = _full_heads_twin(model)
    idx = torch.randint(0, 64, (2, 12))
    out = model(idx, output_attentions=True, output_qkv=True)
    ref = twin(idx, output_attentions=True, output_qkv=True)
    torch.testing.assert_close(model(idx).logits, twin(idx).logits, atol=1e-5, rtol=1e-5)  # SDPA / blocked paths
    torch.testing.assert_close(out.logits, ref.logits, atol=1e-5, rtol=1e-5)  # eager path
    for a, b in zip(out.attentions + out.keys, ref.attentions + ref.keys):
        assert a.shape == b.shape and a.shape[1] == 6  # per query head
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_gqa_shrinks_the_projection_and_the_cached_keys_by_the_group_size():
    from pipeline.model.cache import StreamingCache

    gqa = _model(d_model=48, n_heads=6, n_kv_heads=2)
    assert gqa.blocks[0].attn.qkv.weight.shape == (48 + 2 * 16, 48)
    twin, idx, sizes, logits = _full_heads_twin(gqa), torch.randint(0, 64, (1, 12)), [], []
    for m in (twin, gqa):
        cache = StreamingCache(m.config, 2, 6)
        logits.append(torch.cat([m(idx[:, i : i + 4], cache=cache).logits for i in range(0, 12, 4)], 1))
        sizes.append(sum(layer.k.numel() + layer.v.numel() for layer in cache.layers))
    assert sizes[0] == 3 * sizes[1]
    torch.testing.assert_close(logits[1], logits[0], atol=1e-5, rtol=1e-5)  # evicting per key/value head


def test_n_kv_heads_must_divide_n_heads():
    with pytest.raises(ValueError, match=r"^arch.n_kv_heads=4: must be a positive divisor of n_heads=6$"):
        ModelConfig.from_preset("micro", d_model=48, n_heads=6, n_kv_heads=4)
