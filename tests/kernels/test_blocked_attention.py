"""Blocked attention (pipeline.kernels) against the model's eager operations, forward and
backward, for every non-softmax op, mask, bias slots and positional biases, in both of its
implementations (torch tiles; fused Triton tiles, here under TRITON_INTERPRET=1, see
tests/conftest.py); and the memory property: no T x T tensor is ever allocated."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pipeline.kernels import AttentionSpec, blocked_attention, chunked_linear_attention, triton_tiles
from pipeline.model import ModelConfig, Transformer
from pipeline.model.attention_ops import OPS, blocked_spec, build_feature_map
from pipeline.model.masks import admitted_pairs
from pipeline.model.positional import ALiBi, RelativeBucket, T5Bias

B, H, T, DH = 2, 2, 19, 8  # T not a multiple of the block size on purpose

ATTENTION = [
    dict(op="sigmoid", normalizer="sum"),
    dict(op="sigmoid", normalizer="none"),
    dict(op="sigmoid", normalizer="sum", p=2.0),
    dict(op="sigmoid", normalizer="sum", p=0.5),
    dict(op="elu1", normalizer="sum"),
    dict(op="elu1", normalizer="none"),
    dict(op="kernel", feature_map="identity", normalizer="abs_clamp"),
    dict(op="kernel", feature_map="identity", normalizer="none"),
    dict(op="kernel", feature_map="elu1", normalizer="sum"),
    dict(op="kernel", feature_map="mlp", normalizer="abs_clamp"),
]
# (mask, number of k*/v* bias slots)
MASKS = [
    (dict(mask="causal"), 0),
    (dict(mask="causal"), 1),
    (dict(mask="sliding", window=5), 1),
    (dict(mask="prefix", prefix_len=6), 1),
]


def _config(attention, mask, sink_tokens=0, positional="nope"):
    return ModelConfig(
        vocab_size=64,
        d_model=H * DH,
        n_layers=1,
        n_heads=H,
        d_ffn=32,
        max_seq_len=64,
        positional=positional,
        attention=dict(attention),
        sink_tokens=sink_tokens,
        **mask,
    )


def _eager(cfg, q, k, v, phi, slot_k=None, slot_v=None, score_bias=None):
    """The model's eager path: attention_ops on [slots | tokens] with the additive mask."""
    Tq, Tk = q.shape[2], k.shape[2]
    idx_q, idx_k = torch.arange(Tk - Tq, Tk), torch.arange(Tk)
    bias = torch.zeros(1, Tq, Tk, dtype=q.dtype) if score_bias is None else score_bias(idx_q, idx_k).to(q.dtype)
    mask = bias.masked_fill(~admitted_pairs(cfg, idx_q, idx_k), float("-inf"))[None]
    if slot_k is not None:
        mask = torch.cat((torch.zeros(1, mask.shape[1], Tq, slot_k.shape[2], dtype=q.dtype), mask), -1)
        k, v = torch.cat((slot_k, k), 2), torch.cat((slot_v, v), 2)
    return OPS[cfg.attention.op].fn(q, k, mask, cfg.attention, phi).weights @ v


def _blocked(q, k, v, cfg, **kwargs):
    """blocked_attention with the spec the model passes: from the op's registry entry."""
    return blocked_attention(q, k, v, blocked_spec(cfg), **kwargs)


def _inputs(seed, n_slots=0, dtype=torch.float64, tq=T):
    g = torch.Generator().manual_seed(seed)
    make = lambda t: torch.randn(B, H, t, DH, generator=g, dtype=dtype).requires_grad_()
    q, k, v = make(tq), make(T), make(T)
    slots = (make(n_slots), make(n_slots)) if n_slots else (None, None)
    return q, k, v, *slots


def _compare(
    cfg,
    phi,
    q,
    k,
    v,
    slot_k=None,
    slot_v=None,
    score_bias=None,
    block=8,
    query_block=8,
    tol=1e-9,
    impl="torch",
    bias_tensor=None,
):
    """bias_tensor: score_bias as the model's [1|H, Tq, Tk] tensor for the blocked path."""
    leaves = [t for t in (q, k, v, slot_k, slot_v) if t is not None] + (list(phi.parameters()) if phi else [])
    ref = _eager(cfg, q, k, v, phi, slot_k, slot_v, score_bias)
    out = _blocked(
        q,
        k,
        v,
        cfg,
        feature_map=phi,
        slot_k=slot_k,
        slot_v=slot_v,
        score_bias=score_bias if bias_tensor is None else bias_tensor,
        block_size=block,
        query_block=query_block,
        impl=impl,
    )
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    weight = torch.randn_like(ref)
    g_ref = torch.autograd.grad((ref * weight).sum(), leaves)
    g_out = torch.autograd.grad((out * weight).sum(), leaves)
    for a, b in zip(g_out, g_ref):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


@pytest.mark.parametrize("mask,n_slots", MASKS, ids=lambda m: m["mask"] if isinstance(m, dict) else f"slots{m}")
@pytest.mark.parametrize("attention", ATTENTION, ids=lambda a: "-".join(str(v) for v in a.values()))
def test_blocked_matches_eager_forward_and_backward(attention, mask, n_slots):
    torch.manual_seed(0)
    cfg = _config(attention, mask)
    phi = build_feature_map(cfg.attention, DH)
    if phi is not None:
        phi = phi.double()
    _compare(cfg, phi, *_inputs(1, n_slots))


@pytest.mark.parametrize("positional", ["alibi", "relative"])
@pytest.mark.parametrize("op", ["sigmoid", "elu1"])
def test_fixed_positional_bias_is_evaluated_per_tile(positional, op):
    cfg = _config(dict(op=op), dict(mask="sliding", window=7), positional=positional)
    module = {"alibi": ALiBi, "relative": RelativeBucket}[positional](cfg)
    _compare(cfg, None, *_inputs(2, n_slots=1), score_bias=module.score_bias, query_block=None)


def test_score_bias_given_as_the_models_tensor():
    """The model's AttentionContext.score_bias [1|H, Tq, Tk] for a suffix of queries."""
    cfg = _config(dict(op="elu1"), dict(mask="causal"), positional="alibi")
    q, k, v, *_ = _inputs(7, tq=11)
    tensor = ALiBi(cfg).score_bias(torch.arange(T - 11, T), torch.arange(T))
    ref = _eager(cfg, q, k, v, None, score_bias=ALiBi(cfg).score_bias)
    torch.testing.assert_close(_blocked(q, k, v, cfg, score_bias=tensor, block_size=4), ref)


def test_sink_tokens_shift_the_prefix_and_queries_may_be_a_suffix():
    """Prefix = sink tokens + prefix_len; Tq < Tk (a cached step) offsets the query positions."""
    cfg = _config(dict(op="sigmoid"), dict(mask="prefix", prefix_len=3), sink_tokens=2)
    _compare(cfg, None, *_inputs(3))
    _compare(cfg, None, *_inputs(4, tq=7), query_block=None)
    _compare(cfg, None, *_inputs(4, tq=7), block=3, query_block=2)


needs_triton = pytest.mark.skipif(
    not triton_tiles.available(),
    reason="triton is not installed (a dev dependency on Linux x86_64: pip install -e .[dev])",
)
# what reaches the fused kernels: kernel ops with a causal or prefix mask take the linear form
FUSED_CASES = [
    (a, m, n)
    for a in ATTENTION
    if a.get("p", 1.0) == 1.0
    for m, n in MASKS
    if not (a["op"] == "kernel" and m["mask"] != "sliding")
]


@needs_triton
@pytest.mark.parametrize(
    "attention,mask,n_slots",
    FUSED_CASES,
    ids=lambda x: "-".join(str(v) for v in x.values()) if isinstance(x, dict) else f"slots{x}",
)
def test_fused_triton_tiles_match_eager(attention, mask, n_slots):
    """16 x 16 tiles (the smallest tl.dot) over T = 19: a partial tile in both directions."""
    cfg = _config(attention, mask)
    phi = build_feature_map(cfg.attention, DH)
    if phi is not None:
        phi = phi.double()
    _compare(cfg, phi, *_inputs(1, n_slots), block=16, query_block=16, impl="triton")


@needs_triton
@pytest.mark.parametrize("positional", ["alibi", "relative"])
def test_fused_triton_tiles_take_the_models_bias_tensor_and_a_query_suffix(positional):
    """A fixed positional bias as the model passes it ([1|H, Tq, Tk]), sink tokens in the
    prefix, and Tq < Tk (queries are the last Tq positions), with a sliding window."""
    for mask, tq in ((dict(mask="sliding", window=7), T), (dict(mask="prefix", prefix_len=3), 7)):
        cfg = _config(dict(op="sigmoid"), mask, sink_tokens=2, positional=positional)
        module = {"alibi": ALiBi, "relative": RelativeBucket}[positional](cfg)
        tensor = module.score_bias(torch.arange(T - tq, T), torch.arange(T)).double()
        _compare(
            cfg,
            None,
            *_inputs(8, n_slots=1, tq=tq),
            score_bias=module.score_bias,
            bias_tensor=tensor,
            block=16,
            query_block=16,
            impl="triton",
        )


@needs_triton
def test_fused_triton_tiles_in_float32_and_with_the_default_blocks():
    cfg = _config(dict(op="elu1", normalizer="none"), dict(mask="causal"))
    q, k, v, *_ = _inputs(6, dtype=torch.float32)
    _compare(cfg, None, q, k, v, block=None, query_block=None, tol=2e-5, impl="triton")


def test_fused_triton_tiles_refuse_what_they_do_not_compute():
    cfg = _config(dict(op="sigmoid", normalizer="sum", p=2.0), dict(mask="causal"))
    q, k, v, *_ = _inputs(5)
    with pytest.raises(ValueError, match="impl='triton' needs"):
        _blocked(q, k, v, cfg, impl="triton")
    with pytest.raises(ValueError, match="impl='cuda'; allowed auto, torch, triton"):
        _blocked(q, k, v, cfg, impl="cuda")


def test_learned_score_bias_is_refused():
    cfg = _config(dict(op="sigmoid"), dict(mask="causal"), positional="t5")
    q, k, v, *_ = _inputs(5)
    t5 = T5Bias(cfg)
    with pytest.raises(ValueError, match="learned bias"):
        _blocked(q, k, v, cfg, score_bias=t5.score_bias)
    with pytest.raises(ValueError, match="learned bias"):
        _blocked(q, k, v, cfg, score_bias=t5.score_bias(torch.arange(T), torch.arange(T)))
    if triton_tiles.available():
        with pytest.raises(ValueError, match="learned bias"):
            _blocked(q, k, v, cfg, score_bias=t5.score_bias(torch.arange(T), torch.arange(T)), impl="triton")


def test_only_known_similarities_are_computed():
    assert OPS["softmax"].tiles is None and OPS["elu1"].tiles == "elu1"
    q, k, v, *_ = _inputs(5)
    with pytest.raises(ValueError, match="similarity='softmax'; allowed sigmoid, elu1, identity"):
        blocked_attention(q, k, v, AttentionSpec(similarity="softmax"))
    for spec in OPS.values():  # the ops with tiles train through the fused kernels on a GPU
        assert spec.tiles is None or spec.tiles in triton_tiles.SIMILARITIES


def test_float32_matches_within_float_tolerance():
    cfg = _config(dict(op="sigmoid", normalizer="none"), dict(mask="causal"))
    q, k, v, *_ = _inputs(6, dtype=torch.float32)
    _compare(cfg, None, q, k, v, tol=2e-5)


def test_chunked_linear_hand_example():
    """One head, d_h = 1, phi = identity, no normaliser: y_i = sum_{j<=i} q_i k_j v_j."""
    q = torch.tensor([1.0, 2.0, -1.0, 0.5]).view(1, 1, 4, 1)
    k = torch.tensor([1.0, -1.0, 2.0, 3.0]).view(1, 1, 4, 1)
    v = torch.tensor([2.0, 1.0, 1.0, -2.0]).view(1, 1, 4, 1)
    y = chunked_linear_attention(q, k, v, normalizer="none", chunk=3).flatten()
    # running sums of k_j v_j: 2, 1, 3, -3
    torch.testing.assert_close(y, torch.tensor([2.0, 2.0, -3.0, -1.5]))


class _LargestAllocation(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize(
    "attention", [dict(op="sigmoid"), dict(op="kernel", feature_map="elu1")], ids=["tiled", "linear"]
)
def test_no_tensor_of_t_by_t_elements_is_allocated(attention):
    """T = 1024: one T x T slice would be 1M elements; the blocked path's largest tensor
    (forward and backward) is a T x 32 key-block tile (or linear chunk), 32 times smaller."""
    t, dh = 1024, 8
    cfg = ModelConfig(
        vocab_size=64,
        d_model=dh,
        n_layers=1,
        n_heads=1,
        d_ffn=32,
        max_seq_len=t,
        attention=attention,
        positional="nope",
    )
    phi = build_feature_map(cfg.attention, dh)
    q, k, v = (torch.randn(1, 1, t, dh, requires_grad=True) for _ in range(3))
    with _LargestAllocation() as probe:
        out = _blocked(q, k, v, cfg, feature_map=phi, block_size=32)
        out.square().sum().backward()
    assert probe.largest <= t * 32 == t * t // 32, probe.largest
    assert math.isfinite(q.grad.sum().item())


@pytest.mark.parametrize(
    "overrides",
    [
        dict(attention=dict(op="sigmoid", normalizer="none"), biases=dict(kind="kv")),
        dict(attention=dict(op="elu1"), mask="sliding", window=6, positional="alibi", sink_tokens=1),
        dict(attention=dict(op="kernel", feature_map="mlp", normalizer="abs_clamp"), mask="prefix", prefix_len=4),
        dict(attention=dict(op="sigmoid", normalizer="none", gated=True, gate_granularity="elementwise")),
    ],
    ids=["sigmoid-kv", "elu1-sliding-alibi", "kernel-mlp-prefix", "sigmoid-elementwise-gate"],
)
@pytest.mark.parametrize("impl", ["auto", pytest.param("triton", marks=needs_triton)])
def test_model_training_path_matches_its_eager_path(overrides, impl, monkeypatch):
    """The model's training path (pipeline.kernels, called from Attention.forward) against its
    output_attentions path (always eager): logits and every gradient, fp64. ``triton`` forces
    the fused kernels that CUDA tensors get (the torch tiles on a CPU otherwise)."""
    import pipeline.model.attention as attention_module

    calls = []
    real = attention_module.blocked_attention
    monkeypatch.setattr(
        attention_module, "blocked_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw, impl=impl)
    )
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("micro", init_std=0.2, **overrides)).double()
    idx = torch.randint(0, 64, (2, 21))
    results = []
    for flag in (False, True):
        model.zero_grad()
        logits = model(idx, output_attentions=flag).logits
        logits.square().mean().backward()
        results.append([logits.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None])
        assert len(calls) == model.config.n_layers, "only the training path uses the blocked kernel"
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
