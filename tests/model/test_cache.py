"""Streaming KV cache: exact when nothing is evicted; x + y eviction keeps the right entries."""

import pytest
import torch

from pipeline.model import ModelConfig, StreamingCache, Transformer


def _model(**overrides):
    torch.manual_seed(0)
    return Transformer(ModelConfig.from_preset("micro", init_std=0.2, **overrides)).eval()


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        dict(sink_tokens=1),
        dict(sink_tokens=2, positional="alibi"),
        dict(biases={"kind": "kv"}),
        dict(attention={"op": "sigmoid", "normalizer": "none"}),
        dict(positional="relative"),
        dict(positional="learned"),
        dict(attention={"op": "ssmax"}, biases={"kind": "kv"}, sink_tokens=1),  # n_i counts cached keys
    ],
    ids=lambda o: str(o) or "default",
)
def test_step_by_step_equals_full_forward_when_nothing_is_evicted(overrides):
    model = _model(**overrides)
    idx = torch.randint(0, 64, (2, 12))
    full = model(idx).logits
    cache = StreamingCache(model.config, n_initial=2, n_recent=12)
    with torch.no_grad():
        steps = [model(idx[:, :3], cache=cache).logits]  # a prompt, then one token at a time
        steps += [model(idx[:, t : t + 1], cache=cache).logits for t in range(3, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == 12 + model.config.sink_tokens


def test_eviction_keeps_first_x_and_most_recent_entries_unrotated():
    model = _model(sink_tokens=1)
    idx = torch.randint(0, 64, (1, 10))
    cache = StreamingCache(model.config, n_initial=2, n_recent=3)
    with torch.no_grad():
        for t in range(10):
            out = model(idx[:, t : t + 1], cache=cache)
        # layer-0 keys depend on their token only: rebuild the expected (unrotated) keys
        attn = model.blocks[0].attn
        x = model.blocks[0].attn_norm(torch.cat([model.sink_tokens[None], model.embed(idx)], 1))
        k = attn.qkv(x).view(1, 11, 3, 2, 16)[:, :, 1].transpose(1, 2)
    kept = [0, 1, 8, 9, 10]  # sink token + first real token, then the 3 most recent
    torch.testing.assert_close(cache.layers[0].k, k[:, :, kept])
    assert cache.length == 5 and cache.sinks_kept == 1
    assert out.n_extra_keys == 1 and out.logits.shape == (1, 1, 64)


def test_evicted_cache_rerotates_keys_by_their_cache_index():
    model = _model()
    idx = torch.randint(0, 64, (1, 9))
    cache = StreamingCache(model.config, n_initial=1, n_recent=3)
    with torch.no_grad():
        for t in range(9):
            out = model(idx[:, t : t + 1], cache=cache, output_qkv=True)
        assert cache.length == 4
        # the newest token sits at cache index 3 and its query is rotated by position 3
        cos, sin = model.positional.rotary(torch.tensor([3]))
        attn = model.blocks[0].attn
        x = model.blocks[0].attn_norm(model.embed(idx[:, -1:]))
        q = attn.qkv(x).view(1, 1, 3, 2, 16)[:, :, 0].transpose(1, 2)
    from pipeline.model.positional import apply_rotary

    torch.testing.assert_close(out.queries[0], apply_rotary(q, cos, sin))


def test_zero_initial_entries_drop_the_sink_token():
    model = _model(sink_tokens=1)
    cache = StreamingCache(model.config, n_initial=0, n_recent=4)
    with torch.no_grad():
        for t in range(6):
            out = model(torch.tensor([[t]]), cache=cache)
    assert cache.sinks_kept == 0 and out.n_extra_keys == 0


def test_bad_cache_sizes():
    with pytest.raises(ValueError, match="x\\+y"):
        StreamingCache(ModelConfig.from_preset("micro"), n_initial=1, n_recent=0)


def test_rows_with_their_own_x_evict_like_separate_caches():
    model = _model(sink_tokens=1)
    idx = torch.randint(0, 64, (1, 9))
    pairs = [(0, 5), (1, 4), (3, 2)]
    batched = StreamingCache(model.config, n_initial=[x for x, _ in pairs], n_recent=[y for _, y in pairs])
    singles = [StreamingCache(model.config, n_initial=x, n_recent=y) for x, y in pairs]
    with torch.no_grad():
        for t in range(9):
            out = model(idx[:, t : t + 1].expand(3, 1), cache=batched).logits
            for row, cache in enumerate(singles):
                torch.testing.assert_close(out[row], model(idx[:, t : t + 1], cache=cache).logits[0])
    for row, cache in enumerate(singles):
        torch.testing.assert_close(batched.layers[1].k[row], cache.layers[1].k[0])
    assert batched.sinks_kept == 0 and [c.sinks_kept for c in singles] == [0, 1, 1]


def test_rows_must_share_x_plus_y():
    with pytest.raises(ValueError, match="share x\\+y"):
        StreamingCache(ModelConfig.from_preset("micro"), n_initial=[0, 1], n_recent=[5, 5])
