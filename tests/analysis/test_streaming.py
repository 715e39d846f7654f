"""Streaming perplexity: with x+y >= length it equals the full-context perplexity. With
evictions, in a one-layer model (whose pre-rotary keys and values depend on the token alone),
each prediction equals a fresh forward over exactly the kept tokens placed at contiguous
positions, which checks the eviction rule and the re-rotation of the kept keys."""

import pytest
import torch
import torch.nn.functional as F
from analysis_helpers import micro_model

from pipeline.analysis import stream_ppl, streamers, streaming
from pipeline.analysis.streamers import CacheSpec, HFRotaryStreamer, SinkLabStreamer, perplexity
from sinklab_io.mappings import settings_of


def kept_indices(t, spec, extra_initial=0):
    """Token indices visible when predicting from token t: the first x and the latest, so that
    kept entries + the incoming token <= x + y (mirrors the eviction rule independently)."""
    cap = spec.n_initial + spec.n_recent
    if t + 1 + extra_initial <= cap:
        return list(range(t + 1))
    first = max(0, spec.n_initial - extra_initial)
    n_recent = cap - spec.n_initial
    return list(range(first)) + list(range(t + 1 - n_recent, t + 1))


def assert_equals_fresh_forwards(model, ids, got, spec, extra_initial=0):
    """got[t], the streamed NLL of ids[t + 1], equals a fresh forward over exactly the kept tokens."""
    for t in range(ids.numel() - 1):
        with torch.no_grad():
            logits = model(ids[kept_indices(t, spec, extra_initial)][None]).logits[0, -1]
        assert got[t].item() == pytest.approx(-F.log_softmax(logits, -1)[ids[t + 1]].item(), abs=1e-4), t


@pytest.fixture(scope="module")
def tiny_llama(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir), dtype=torch.float32).eval()


def test_parse_cache_spec():
    assert CacheSpec.parse("4+1020") == CacheSpec(4, 1020) and str(CacheSpec(1, 3)) == "1+3"
    for bad in ("4", "4+0", "a+b"):
        with pytest.raises(ValueError, match="x\\+y"):
            CacheSpec.parse(bad)


def test_hf_llama_full_cache_equals_full_context(tiny_llama):
    ids = torch.randint(0, 300, (24,), generator=torch.Generator().manual_seed(0))
    s = HFRotaryStreamer(tiny_llama)
    full = s.full_nll(ids)
    assert torch.allclose(s.nll(ids, [CacheSpec(0, 24)])[0], full, atol=1e-4)
    assert torch.allclose(s.nll(ids, [CacheSpec(2, 30)])[0], full, atol=1e-4)
    assert perplexity(s.nll(ids, [CacheSpec(1, 23)])[0]) == pytest.approx(perplexity(full), rel=1e-5)


@pytest.mark.parametrize("spec", [CacheSpec(0, 6), CacheSpec(2, 5)])
def test_hf_llama_eviction_matches_recomputation(spec):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    one_layer = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=300,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    ).eval()
    ids = torch.randint(0, 300, (16,), generator=torch.Generator().manual_seed(1))
    assert_equals_fresh_forwards(one_layer, ids, HFRotaryStreamer(one_layer).nll(ids, [spec])[0], spec)


def test_hf_streaming_rejects_models_without_rotary(tiny_gpt2_dir):
    from transformers import AutoModelForCausalLM

    with pytest.raises(ValueError, match="rotary"):
        HFRotaryStreamer(AutoModelForCausalLM.from_pretrained(str(tiny_gpt2_dir)))


def test_sinklab_micro_full_cache_equals_full_context():
    model = micro_model()
    ids = torch.randint(0, 64, (20,), generator=torch.Generator().manual_seed(2))
    s = SinkLabStreamer(model)
    assert torch.allclose(s.nll(ids, [CacheSpec(0, 20)])[0], s.full_nll(ids), atol=1e-4)


def test_sinklab_micro_eviction_with_sink_token():
    model = micro_model(sink_tokens=1, n_layers=1)
    ids = torch.randint(0, 64, (14,), generator=torch.Generator().manual_seed(3))
    spec = CacheSpec(1, 5)  # x counts the sink token: it stays, real tokens use the other 5 entries
    assert_equals_fresh_forwards(model, ids, SinkLabStreamer(model).nll(ids, [spec])[0], spec, extra_initial=1)


def test_configs_sharing_x_plus_y_stream_as_one_batch_with_the_same_results(tiny_llama):
    ids = torch.randint(0, 300, (20,), generator=torch.Generator().manual_seed(4))
    specs = [CacheSpec(0, 6), CacheSpec(1, 5), CacheSpec(4, 2)]
    for streamer in (HFRotaryStreamer(tiny_llama), SinkLabStreamer(micro_model(sink_tokens=1))):
        ids_ = ids % 64 if isinstance(streamer, SinkLabStreamer) else ids
        batched = streamer.nll(ids_, specs)
        one_by_one = torch.stack([streamer.nll(ids_, [spec])[0] for spec in specs])
        torch.testing.assert_close(batched, one_by_one, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(batched[0], batched[2])  # the rows did evict differently


def test_filling_the_cache_in_chunks_equals_one_token_at_a_time(tiny_llama, monkeypatch):
    ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(5))
    specs = [CacheSpec(0, 32), CacheSpec(2, 30)]
    for streamer in (HFRotaryStreamer(tiny_llama), SinkLabStreamer(micro_model(sink_tokens=1))):
        ids_ = ids % 64 if isinstance(streamer, SinkLabStreamer) else ids
        results = []
        for rows_x_tokens in (2048, 14, 1):  # the whole fill in one forward, chunks of 7, one token each
            monkeypatch.setattr(streamers, "PREFILL_TOKENS", rows_x_tokens)
            results.append(streamer.nll(ids_, specs))
        torch.testing.assert_close(results[0], results[2], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(results[1], results[2], atol=1e-5, rtol=1e-5)


def test_group_by_capacity():
    a, b, c = CacheSpec(0, 8), CacheSpec(1, 7), CacheSpec(2, 4)
    assert streamers.group_by_capacity([a, c, b, a]) == [[a, b], [c]]
    with pytest.raises(ValueError, match="one x\\+y"):
        SinkLabStreamer(micro_model()).nll(torch.arange(5), [a, c])


def tiny_gemma3(layer_type: str):
    """One Gemma-3 layer of the given type; its rotary module knows that type's frequencies only."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    thetas = {"sliding_attention": 100.0, "full_attention": 1e6}
    config = Gemma3TextConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        layer_types=[layer_type],
        sliding_window=64,
        max_position_embeddings=256,
        rope_parameters={t: {"rope_type": "default", "rope_theta": v} for t, v in thetas.items()},
    )
    torch.manual_seed(0)
    return Gemma3ForCausalLM(config).eval()


@pytest.mark.parametrize("layer_type", ["sliding_attention", "full_attention"])
def test_gemma3_layers_re_rotate_with_their_own_frequencies(layer_type):
    model = tiny_gemma3(layer_type)
    streamer = HFRotaryStreamer(model)
    assert streamer.layer_types == [layer_type]
    ids = torch.randint(0, 300, (20,), generator=torch.Generator().manual_seed(6))
    spec = CacheSpec(2, 6)
    assert_equals_fresh_forwards(model, ids, streamer.nll(ids, [spec])[0], spec)


def test_gemma3_streams_with_its_bos_first(tmp_path, monkeypatch):
    monkeypatch.setattr(streamers, "PREFILL_TOKENS", 1)  # every cached key re-rotated at every step
    reading = settings_of(streaming.Reading, stream_ppl.build_parser().parse_args(["gemma3-270m"]))
    streamer, ids, subject = streaming.load_subject("gemma3-270m", reading, 2048)
    assert ids[0] == subject.tokenizer.bos_token_id  # Gemma's tokenizer starts with BOS, and --bos auto follows it
    ids = torch.tensor(ids[:32])
    streamed = perplexity(streamer.nll(ids, [CacheSpec(0, 32)])[0])  # nothing evicted
    assert streamed == pytest.approx(perplexity(streamer.full_nll(ids)), rel=1e-4)
