"""The LM head fused with the cross-entropy (pipeline.train.loss) against the plain
logits + F.cross_entropy path: loss and gradients, chunking, grad scaling, no-grad use, and the
next-token loss of a model (prefix start, sink tokens, tied head, ZeRO-3 fallback)."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from pipeline.model import ModelConfig, Transformer
from pipeline.train.loss import chunk_rows, linear_cross_entropy, next_token_loss


class _MatmulDtypes(TorchDispatchMode):
    """The dtypes of every matrix product's operands."""

    def __init__(self):
        super().__init__()
        self.dtypes = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in ("mm", "addmm", "bmm"):
            self.dtypes |= {a.dtype for a in args if isinstance(a, torch.Tensor) and a.dim() == 2}
        return func(*args, **(kwargs or {}))


def _leaves(n=37, d=12, vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, d, generator=g, dtype=torch.float64, requires_grad=True)
    return hidden, weight, torch.randint(0, vocab, (n,), generator=g)


def _grads(loss_fn, hidden, weight, targets, factor):
    loss = loss_fn(hidden, weight, targets)
    grads = torch.autograd.grad(loss * factor, (hidden, weight))
    return loss.detach(), grads


@pytest.mark.parametrize("rows", [1, 8, 37, 64])  # one row, a partial last chunk, one chunk, rows > N
def test_fused_loss_and_gradients_equal_the_logits_path(rows):
    hidden, weight, targets = _leaves()
    plain = lambda h, w, t: F.cross_entropy(h @ w.T, t)
    fused = lambda h, w, t: linear_cross_entropy(h, w, t, rows=rows)
    ref_loss, ref_grads = _grads(plain, hidden, weight, targets, factor=3.0)
    loss, grads = _grads(fused, hidden, weight, targets, factor=3.0)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_only_the_inputs_that_need_gradients_get_them_and_no_grad_gives_the_loss():
    hidden, weight, targets = _leaves(seed=1)
    ref = F.cross_entropy(hidden @ weight.T, targets)
    frozen = weight.detach()
    (g_h,) = torch.autograd.grad(linear_cross_entropy(hidden, frozen, targets, rows=5), hidden)
    torch.testing.assert_close(g_h, torch.autograd.grad(F.cross_entropy(hidden @ frozen.T, targets), hidden)[0])
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(hidden, weight, targets, rows=5), ref.detach())


def test_under_bf16_autocast_products_are_bf16_and_gradients_keep_the_parameter_dtype():
    """Lightning's bf16-mixed: fp32 parameters, autocast on. The fused loss computes in bf16 like
    the plain head does, and hands back fp32 gradients."""
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(64, 32, generator=g, requires_grad=True)
    weight = (0.2 * torch.randn(300, 32, generator=g)).requires_grad_()
    targets = torch.randint(0, 300, (64,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_loss, ref_grads = _grads(
            lambda h, w, t: F.cross_entropy((h @ w.T).float(), t), hidden, weight, targets, 1.0
        )
        with _MatmulDtypes() as seen:
            loss, grads = _grads(lambda h, w, t: linear_cross_entropy(h, w, t, rows=16), hidden, weight, targets, 1.0)
    assert seen.dtypes == {torch.bfloat16}, seen.dtypes  # logits, dL/dh and dL/dW products alike
    exact = F.cross_entropy(hidden @ weight.T, targets).detach()
    assert abs(loss - ref_loss) < 1e-2 and abs(loss - exact) < 3e-2 and loss != exact  # bf16, not fp32
    for a, b in zip(grads, ref_grads):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=0.05, atol=2e-3)


def test_chunk_rows_follow_the_vocabulary_and_device():
    assert chunk_rows(10_000, 8192, torch.device("cpu")) == 256
    assert chunk_rows(10_000, 32_000, torch.device("cuda")) == 1048
    assert chunk_rows(100, 8192, torch.device("cpu")) == 100
    assert chunk_rows(10, 10**9, torch.device("cpu")) == 1


def test_bad_shapes_are_named():
    hidden, weight, targets = _leaves()
    with pytest.raises(
        ValueError, match=r"hidden \[N, d\], weight \[V, d\], targets \[N\]; got \(37, 12\), \(50, 12\), \(36,\)"
    ):
        linear_cross_entropy(hidden, weight, targets[:-1])


@pytest.mark.parametrize(
    "overrides,start",
    [({}, 0), ({"sink_tokens": 1, "tie_embeddings": True}, 0), ({"mask": "prefix", "prefix_len": 4}, 3)],
    ids=["plain", "sink-token-tied", "prefix-lm"],
)
def test_next_token_loss_equals_logits_and_cross_entropy(overrides, start):
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("micro", **overrides)).double()
    tokens = torch.randint(0, model.config.vocab_size, (3, 17))

    def reference():
        logits = model(tokens).logits[:, :-1][:, start:]
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:][:, start:].reshape(-1))

    results = []
    for loss_fn in (reference, lambda: next_token_loss(model, tokens, start)):
        model.zero_grad()
        loss = loss_fn()
        loss.backward()
        results.append([loss.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(results[0]) == len(results[1]) == 1 + sum(p.requires_grad for p in model.parameters())
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_a_zero3_partitioned_head_takes_the_logits_path(monkeypatch):
    """DeepSpeed marks ZeRO-3 parameters with ds_status; then the head runs as a module (so
    DeepSpeed's hooks gather its weight) and the fused loss is not called."""
    import pipeline.train.loss as loss_module

    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("micro"))
    tokens = torch.randint(0, model.config.vocab_size, (2, 9))
    fused = next_token_loss(model, tokens)
    model.lm_head.weight.ds_status = "NOT_AVAILABLE"
    monkeypatch.setattr(loss_module, "linear_cross_entropy", lambda *a, **k: pytest.fail("fused path taken"))
    torch.testing.assert_close(next_token_loss(model, tokens), fused)
