"""Passkey retrieval under a streaming cache: the prompt places the key where asked, the streamed
greedy answer equals plain full-context decoding when nothing is evicted, and on the real SmolLM2
the key is found while it is cached and lost once the x + y window has moved past it."""

import json

import pytest
import torch
from analysis_helpers import micro_model

from pipeline.analysis import passkey
from pipeline.analysis.passkey import Trial, build_trial, key_cached
from pipeline.analysis.streamers import CacheSpec, HFRotaryStreamer, SinkLabStreamer


def test_build_trial_puts_the_key_at_its_depth_in_prompts_of_one_length(hf_tokenizer):
    def enc(text):
        return hf_tokenizer(text, add_special_tokens=False)["input_ids"]

    trials = [build_trial(hf_tokenizer, 400, d, "12345") for d in (0.0, 0.5, 1.0)]
    assert len({len(t.ids) for t in trials}) == 1 and len(trials[0].ids) <= 400
    for t in trials:
        assert [t.ids[a:b] for a, b in t.key_spans] == [enc(" 12345")] * 2
    intro = len(enc(passkey.INSTRUCTION)) + len(enc(passkey.NEEDLE[0]))
    assert trials[0].key_spans[0][0] == intro  # depth 0: first thing after the instruction
    tail = len(enc(passkey.NEEDLE[-1])) + len(enc(passkey.QUESTION))
    assert trials[2].key_spans[1][1] == len(trials[2].ids) - tail  # depth 1: last thing before the question
    assert trials[0].key_spans[0] < trials[1].key_spans[0] < trials[2].key_spans[0]
    assert build_trial(hf_tokenizer, 400, 0.0, "12345", bos=7).ids[0] == 7
    with pytest.raises(ValueError, match="--length 100: too short"):
        build_trial(hf_tokenizer, 100, 0.5, "12345")


def test_key_cached_follows_the_eviction_rule():
    trial = Trial(0.5, "1", list(range(100)), ((40, 45), (48, 50)))
    assert key_cached(trial, CacheSpec(0, 100))  # everything fits
    assert key_cached(trial, CacheSpec(4, 60))  # 40..99 are the 60 latest
    assert key_cached(trial, CacheSpec(4, 52))  # 48..99: the first mention is gone, the second is whole
    assert not key_cached(trial, CacheSpec(4, 51))  # 49..99: neither is whole
    assert key_cached(trial, CacheSpec(45, 10))  # the first mention is among the first x
    assert not key_cached(trial, CacheSpec(44, 10))
    assert not key_cached(trial, CacheSpec(45, 10), sink_tokens=1)  # x counts the sink token
    assert key_cached(trial, CacheSpec(46, 10), sink_tokens=1)
    assert key_cached(trial, CacheSpec(1, 52), sink_tokens=1) and not key_cached(trial, CacheSpec(1, 51), sink_tokens=1)


def test_first_number():
    assert passkey.first_number(" 48213. The") == "48213"
    assert passkey.first_number("11.\nass") == "11" and passkey.first_number("none") is None


def test_streamed_answer_with_everything_cached_equals_generate(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir), dtype=torch.float32).eval()
    prompts = [torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(s)).tolist() for s in (0, 1)]
    got = passkey.answer(HFRotaryStreamer(model), prompts, [CacheSpec(0, 50), CacheSpec(2, 48)], new_tokens=5)
    for prompt, per_spec in zip(prompts, got):
        with torch.no_grad():
            ref = model.generate(torch.tensor([prompt]), max_new_tokens=5, do_sample=False, pad_token_id=0)[
                0, len(prompt) :
            ]
        assert per_spec[0] == per_spec[1] == ref.tolist()


def test_sinklab_streamed_answer_equals_greedy_full_forwards():
    model = micro_model(sink_tokens=1)
    prompts = [torch.randint(0, 64, (30,), generator=torch.Generator().manual_seed(s)).tolist() for s in (0, 1)]
    got = passkey.answer(SinkLabStreamer(model), prompts, [CacheSpec(1, 40)], new_tokens=4)
    for prompt, (tokens,) in zip(prompts, got):
        ids = list(prompt)
        for _ in range(4):
            with torch.no_grad():
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        assert tokens == ids[len(prompt) :]


def test_smollm2_finds_the_key_while_it_is_cached_and_loses_it_after(smollm2):
    """152-token prompts: with 4+60 the key at depth 0 has been evicted before the question, the
    key at depth 1 is in the window; with the whole prompt cached both are found."""
    trials = [build_trial(smollm2.tokenizer, 160, d, "48213") for d in (0.0, 1.0)]
    caches = {CacheSpec(4, 60): "4+60", CacheSpec(0, 200): "full"}
    results = passkey.run_trials(HFRotaryStreamer(smollm2.model), smollm2.tokenizer, trials, caches)
    got = {(r["cache"], r["depth"]): (r["correct"], r["key_cached"]) for r in results}
    assert got == {
        ("4+60", 0.0): (False, False),
        ("4+60", 1.0): (True, True),
        ("full", 0.0): (True, True),
        ("full", 1.0): (True, True),
    }
    table = passkey.accuracy(results, ["4+60", "full"], [0.0, 1.0])
    assert table["4+60"][0.0] == {"accuracy": 0.0, "cached": 0.0} and table["full"][0.0]["accuracy"] == 100.0
    assert "| 4+60 | 0† | 100 | 50 |" in passkey.markdown("smollm2", table, 152, 1)


def test_cli_on_a_sinklab_checkpoint_writes_table_csv_json_and_figure(tmp_path, hf_tokenizer, capsys):
    from pipeline.model import save_pretrained

    hf_tokenizer.backend_tokenizer.save(str(tmp_path / "tokenizer.json"))
    ckpt = save_pretrained(micro_model(vocab_size=len(hf_tokenizer), max_seq_len=512), tmp_path / "ckpt")
    out = tmp_path / "pk"
    assert (
        passkey.main(
            [
                str(ckpt),
                "--tokenizer",
                str(tmp_path / "tokenizer.json"),
                "--length",
                "300",
                "--depths",
                "0,1",
                "--keys",
                "2",
                "--cache",
                "2+100",
                "--cache",
                "0+102",
                "--full",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "| cache x+y | depth 0 | depth 1 | mean |" in capsys.readouterr().out
    rec = json.loads((out / "passkey.json").read_text())
    assert list(rec["accuracy"]) == ["2+100", "0+102", "full"] and len(rec["trials"]) == 2 * 2 * 3
    assert {r["key_cached"] for r in rec["trials"] if r["cache"] == "full"} == {True}
    assert not any(r["key_cached"] for r in rec["trials"] if r["cache"] == "0+102" and r["depth"] == 0)
    assert (out / "passkey.png").stat().st_size > 0 and (out / "passkey.csv").read_text().startswith("cache,depth,key")
    refused = (
        (["--depths", "0,2"], "--depths"),
        (["--cache", "3"], "--cache"),
        (["--length", "100"], "too short"),
        (["--length", "2000", "--full"], "--full: needs"),
    )
    for bad, message in refused:
        with pytest.raises(SystemExit, match=message):
            passkey.main([str(ckpt), "--tokenizer", str(tmp_path / "tokenizer.json"), *bad])
