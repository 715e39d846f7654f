"""Eviction policies on a hand-made attention history: which entries each one keeps."""

import dataclasses

import pytest
import torch

from pipeline.model import ModelConfig, StreamingCache, Transformer, eviction
from pipeline.model.eviction import H2O, Evictor, KeyNorm, Row, SnapKV, StreamingLLM

# 6 cached entries, one head; rows = queries. Columns receive 2.7, .85, 1.15, 1.0, .2, .1 in all;
# the last two queries (SnapKV's window of 2) give .4, .15, .25, .9, .2, .1.
HISTORY = torch.tensor(
    [
        [1.0, 0, 0, 0, 0, 0],
        [0.5, 0.5, 0, 0, 0, 0],
        [0.4, 0.1, 0.5, 0, 0, 0],
        [0.4, 0.1, 0.4, 0.1, 0, 0],
        [0.2, 0.1, 0.1, 0.5, 0.1, 0],
        [0.2, 0.05, 0.15, 0.4, 0.1, 0.1],
    ]
)
KEY_NORMS = torch.tensor([5.0, 1.0, 3.0, 2.0, 4.0, 6.0])


def kept(rows, secondary=None):
    """The entries each row keeps when a 7th token comes into a cache of 5 (so 4 stay)."""
    ev = Evictor(rows, capacity=5, n_layers=1, kv_heads=1, secondary=secondary, window=2)
    ev.append(6)
    ev.observe([HISTORY.expand(len(rows), 1, 6, 6)])
    keys = torch.zeros(len(rows), 1, 6, 4)
    keys[..., 0] = KEY_NORMS
    (index,) = ev.indices([keys], n_new=1)
    assert ev.history[0].pos.tolist() == index.tolist()  # the history follows the kept entries
    return [row[0] for row in index.tolist()]


def test_each_policy_keeps_its_entries_with_the_first_token_kept_or_dropped():
    snap = SnapKV(window=2, kernel=1)
    rows = [Row(p, first=1, sinks=s) for p in (StreamingLLM(), H2O(), snap, KeyNorm()) for s in ("keep", "drop")]
    assert kept(rows) == [
        [0, 3, 4, 5],  # StreamingLLM 1+4: the first, then the most recent
        [2, 3, 4, 5],  # 0+5
        [0, 2, 4, 5],  # H2O: recent half {4, 5}, the first, the heaviest of the rest (1.15)
        [2, 3, 4, 5],  # without the first: the two heaviest of 1..3
        [0, 3, 4, 5],  # SnapKV: window {4, 5}, the first, the window's favourite (.9)
        [2, 3, 4, 5],  # .9 and .25
        [0, 1, 2, 3],  # key norm: the first, then the smallest norms 1, 2, 3
        [1, 2, 3, 4],  # the four smallest norms
    ]


def test_without_sinks_h2o_keeps_the_heavy_first_token_on_its_own():
    assert kept([Row(H2O()), Row(KeyNorm())]) == [[0, 2, 4, 5], [1, 2, 3, 4]]


def test_snapkv_pools_the_window_votes_over_neighbouring_keys():
    # kernel 3 (zero padded): the pooled votes of 0..3 are .18, .27, .43, .38
    assert kept([Row(SnapKV(window=2, kernel=3))]) == [[2, 3, 4, 5]]


def test_a_policy_is_registered_by_name_with_its_settings_as_keyword_only_fields():
    assert list(eviction.POLICIES) == ["streaming", "h2o", "snapkv", "keynorm"]
    assert [(f.name, f.default) for f in dataclasses.fields(eviction.POLICIES["snapkv"])] == [
        ("window", 32),
        ("kernel", 5),
    ]
    assert SnapKV.needs_attention and not KeyNorm.needs_attention and H2O().name == "h2o"
    with pytest.raises(TypeError):
        SnapKV(2, 3)
    with pytest.raises(ValueError, match="'h2o' is registered twice"):
        eviction.register(name="h2o")(type("Again", (eviction.Policy,), {"scores": lambda self, h, r, k: k}))


def test_secondary_sinks_are_kept_or_dropped_with_the_first():
    secondary = [torch.tensor([3])]
    assert kept([Row(H2O(), first=1), Row(H2O(), first=1, sinks="drop")], secondary) == [[0, 3, 4, 5], [1, 2, 4, 5]]


def test_heads_choose_their_own_entries():
    ev = Evictor([Row(H2O())], capacity=3, n_layers=1, kv_heads=2)
    ev.append(4)
    later = torch.tensor([[1.0, 0, 0, 0], [0.2, 0.8, 0, 0], [0.1, 0.8, 0.1, 0], [0.1, 0.7, 0.1, 0.1]])
    ev.observe([torch.stack([HISTORY[:4, :4], later])[None]])  # head 0 favours key 0, head 1 key 1
    (index,) = ev.indices([torch.zeros(1, 2, 4, 4)], n_new=1)
    assert index.tolist() == [[[0, 3], [1, 3]]]  # the recent one (capacity // 2) and each head's heaviest


def test_policy_rows_rank_the_sinks_by_the_policy_alone():
    # key norm scores the first entry (norm 5) below 1, 2, 3, 4: its own scores evict it, whatever --first says
    rows = [Row(KeyNorm(), first=1, sinks=s) for s in ("policy", "keep")] + [Row(H2O(), first=2, sinks="policy")]
    assert kept(rows) == [[1, 2, 3, 4], [0, 1, 2, 3], [0, 2, 4, 5]]


def test_dropped_sinks_leave_one_per_eviction_and_first_kept_counts_position_zero():
    """A cache of 4, one token per step: the drop row loses its 3 sinks over 3 evictions, not at
    the first; first_kept is the share of (eviction, layer, head) that still holds position 0."""
    rows = [Row(StreamingLLM(), first=3, sinks=s) for s in ("drop", "keep", "policy")]
    ev = Evictor(rows, capacity=4, n_layers=2, kv_heads=2)
    assert ev.first_kept() == [None] * 3
    ev.append(4)
    sinks_left = []
    for _ in range(4):
        ev.indices([torch.zeros(3, 2, 4, 1)] * 2, n_new=1)
        sinks_left.append(int((ev.history[0].pos[0, 0] < 3).sum()))
        ev.append(1)
    assert sinks_left == [2, 1, 0, 0]
    assert ev.first_kept()[1:] == [1.0, 0.0]  # recency evicts position 0 at the first eviction


def test_a_dropped_sink_goes_even_from_the_recent_window():
    # entry 5 is a secondary sink inside H2O's recent {4, 5}: 4 and the three heaviest of 0..3 stay
    assert kept([Row(H2O(), sinks="drop")], [torch.tensor([5])]) == [[0, 2, 3, 4]]


def _micro(**overrides):
    torch.manual_seed(0)
    return Transformer(ModelConfig.from_preset("micro", init_std=0.2, **overrides)).eval()


@pytest.mark.parametrize("x", [0, 1, 2])
def test_the_streamingllm_policy_is_the_x_plus_y_cache(x):
    model = _micro(sink_tokens=1)
    idx = torch.randint(0, 64, (1, 12))
    n_layers, heads = model.config.n_layers, model.config.n_heads
    plain = StreamingCache(model.config, n_initial=x, n_recent=5 - x)
    policy = StreamingCache(model.config, x, 5 - x, evictor=Evictor([Row(StreamingLLM(), first=x)], 5, n_layers, heads))
    with torch.no_grad():
        a = torch.cat([model(idx[:, t : t + 1], cache=plain).logits for t in range(12)], 1)
        b = torch.cat([model(idx[:, t : t + 1], cache=policy).logits for t in range(12)], 1)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert policy.sinks_kept == plain.sinks_kept == min(x, 1)


def test_bad_rows():
    with pytest.raises(ValueError, match="policy\\|keep\\|drop"):
        Row(H2O(), sinks="maybe")
    with pytest.raises(ValueError, match="capacity"):
        Evictor([Row(H2O())], capacity=0, n_layers=1, kv_heads=1)
