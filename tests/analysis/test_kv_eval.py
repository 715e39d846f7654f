"""`sinklab kv-eval`: every policy through both streamers; a cache that never fills is full
attention; the StreamingLLM policy is the x + y cache; passkey through the policies' caches; the
command's table, files and refusals."""

import copy
import json
import math
from types import SimpleNamespace

import pytest
import torch
from analysis_helpers import HAMLET, micro_model

from pipeline import metric_names as N
from pipeline.analysis import kv_eval, passkey
from pipeline.analysis.kv_eval import passkey_at
from pipeline.analysis.passkey import first_number
from pipeline.analysis.streamers import CacheSpec, HFRotaryStreamer, SinkLabStreamer, Streamer
from pipeline.model.eviction import POLICIES, Evictor, Row, StreamingLLM
from pipeline.model.eviction import SINKS as MODES
from pipeline.secondary_sinks import MIN_QUERIES, secondary_sink_mask

ROWS = [Row(p(), first=1, sinks=s) for p in POLICIES.values() for s in ("keep", "drop")]


@pytest.fixture(scope="module")
def tiny_llama(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir), dtype=torch.float32).eval()


def test_hf_policies_with_a_full_cache_are_full_attention(tiny_llama):
    ids = torch.randint(0, 300, (24,), generator=torch.Generator().manual_seed(0))
    s = HFRotaryStreamer(tiny_llama)
    evictor = Evictor(ROWS, 24, n_layers=2, kv_heads=2)
    got = s.nll(ids, [CacheSpec(0, 24)] * len(ROWS), evictor=evictor)
    full = s.full_nll(ids)
    for row in got:
        torch.testing.assert_close(row, full, atol=1e-6, rtol=1e-6)
    assert evictor.history[0].received.sum() > 0  # the policies saw the attention


def test_sinklab_policies_with_a_full_cache_are_full_attention():
    model = micro_model(sink_tokens=1)
    ids = torch.randint(0, 64, (20,), generator=torch.Generator().manual_seed(2))
    s = SinkLabStreamer(model)
    evictor = Evictor(ROWS, 21, model.config.n_layers, model.config.n_heads)
    for row in s.nll(ids, [CacheSpec(0, 21)] * len(ROWS), evictor=evictor):
        torch.testing.assert_close(row, s.full_nll(ids), atol=1e-6, rtol=1e-6)


def test_sinklab_sink_token_kept_or_dropped_by_attention_policies():
    model = micro_model(sink_tokens=1)
    ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(4))
    rows = [Row(p(), first=1, sinks=s) for p in (POLICIES["h2o"], POLICIES["snapkv"]) for s in ("keep", "drop")]
    evictor = Evictor(rows, 6, model.config.n_layers, model.config.n_heads)
    nll = SinkLabStreamer(model).nll(ids, [CacheSpec(0, 6)] * len(rows), evictor=evictor)
    assert torch.isfinite(nll).all() and evictor.seen == 16  # the sink token and 15 inputs
    for h in evictor.history:
        assert h.pos.shape == (4, model.config.n_heads, 6)  # 5 kept + the last input
        assert [bool((h.pos[r] == 0).any(-1).all()) for r in range(4)] == [True, False, True, False]
        assert not (h.pos[[1, 3]] == 0).any()


def test_a_text_longer_than_learned_positions_is_read_in_windows():
    model = micro_model(positional="learned", max_seq_len=16, sink_tokens=1)
    subject = SimpleNamespace(kind="sinklab", model=model, max_positions=lambda: 16)
    ids = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(5))
    nll, found = kv_eval.full_pass(subject, ids, eps=0.05, first=1)
    assert nll is None and len(found) == model.config.n_layers
    window = model(ids[None, 16:32], output_attentions=True)  # the second window: stream positions 17..32
    maps = [a[:, :, 1:, 1:] for a in window.attentions]
    expect = [secondary_sink_mask(a, 0.05, 0, MIN_QUERIES)[0].any(0).nonzero()[:, 0] + 17 for a in maps]
    assert sum(len(e) for e in expect) > 0
    assert [f[(f >= 17) & (f < 33)].tolist() for f in found] == [e.tolist() for e in expect]


@pytest.mark.parametrize("x", [0, 2])
def test_hf_streamingllm_policy_equals_the_x_plus_y_cache(tiny_llama, x):
    ids = torch.randint(0, 300, (30,), generator=torch.Generator().manual_seed(1))
    s = HFRotaryStreamer(tiny_llama)
    plain = s.nll(ids, [CacheSpec(x, 8 - x)])
    policy = s.nll(ids, [CacheSpec(x, 8 - x)], evictor=Evictor([Row(StreamingLLM(), first=x)], 8, 2, 2))
    torch.testing.assert_close(policy, plain, atol=0, rtol=0)


def test_the_streamingllm_row_beside_attention_policies_is_the_x_plus_y_cache_to_rounding(tiny_llama):
    """In kv-eval's batch the attention policies switch HF models to eager attention: equal within 1e-5."""
    ids = torch.randint(0, 300, (30,), generator=torch.Generator().manual_seed(1))
    s = HFRotaryStreamer(tiny_llama)
    plain = s.nll(ids, [CacheSpec(2, 6)])
    rows = [Row(StreamingLLM(), first=2), *ROWS]
    batched = s.nll(ids, [CacheSpec(0, 8)] * len(rows), evictor=Evictor(rows, 8, 2, 2))
    torch.testing.assert_close(batched[:1], plain, rtol=1e-5, atol=0)


def test_policies_that_evict_differ_and_stay_finite(tiny_llama):
    ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(3))
    nll = HFRotaryStreamer(tiny_llama).nll(ids, [CacheSpec(0, 10)] * len(ROWS), evictor=Evictor(ROWS, 10, 2, 2))
    assert torch.isfinite(nll).all()
    assert len({round(row.mean().item(), 6) for row in nll}) > 4


def test_cli_table_files_mlflow_and_refusals(tiny_llama_dir, tmp_path, capsys, mlflow_server):
    import mlflow

    out = tmp_path / "kv"
    args = [str(tiny_llama_dir), "--text", str(HAMLET), "--max-tokens", "40", "--budget", "25%", "--budget", "20"]
    logging = ["--mlflow-uri", mlflow_server, "--experiment", "kv-eval-test"]
    assert (
        kv_eval.main([*args, "--out", str(out), "--policies", "streaming,h2o,snapkv", "--snapkv.window", "4", *logging])
        == 0
    )
    saved = json.loads((out / "kv_eval.json").read_text())
    (rec,) = saved["models"].values()
    (run,) = mlflow.MlflowClient(mlflow_server).search_runs(
        [mlflow.get_experiment_by_name("kv-eval-test").experiment_id]
    )
    ppl = rec["budgets"]["25"]["perplexity"]["h2o/drop"]
    assert run.data.metrics[N.kv_perplexity("h2o", "drop", 25)] == pytest.approx(ppl)
    assert (run.data.params["passkey"], run.data.params["depths"], run.data.params["keys"]) == ("1,2", "0,0.5,1", "1")
    assert run.data.params["snapkv.window"] == "4" and saved["settings"]["snapkv.window"] == 4
    assert {b: r["entries"] for b, r in rec["budgets"].items()} == {"25": 10, "50": 20}
    assert set(rec["budgets"]["25"]["perplexity"]) == {
        f"{p}/{m}" for p in ("streaming", "h2o", "snapkv") for m in MODES
    }
    shares = rec["budgets"]["25"]["first_kept"]  # StreamingLLM on its own scores evicts the first token at once
    assert shares["streaming"] == 0 and 0 <= shares["h2o"] <= 1
    assert run.data.metrics[N.kv_first_kept("h2o", 25)] == pytest.approx(100 * shares["h2o"])
    assert rec["budgets"]["25"]["passkey"] == {"1x": None, "2x": None}  # 10 or 20 tokens hold no prompt
    table = capsys.readouterr().out
    assert f"| {tiny_llama_dir.name} | 40 |" in table and (out / "kv_eval.png").exists()
    assert "| h2o | " in table and table.count("| n/a | n/a | n/a | n/a | n/a | n/a |") == 6
    assert "| own scores | sinks kept | sinks dropped | first token kept | dropped / kept |" in table
    assert "| streaming | " in table and " | 0.0% | " in table and "passkey 2x dropped" in table
    for bad, message in (
        (["--budget", "100%"], "--budget '100%': expected a share below 100%"),
        (["--budget", "a"], "--budget 'a': expected a share"),
        (["--budget", "40"], "--budget 40: 40 entries hold the whole 40-token text, so nothing is evicted"),
        (["--budget", "3%"], "--budget 3%: 1 entries of a 40-token text; a cache needs at least 2"),
        (["--sinks", "kept,some"], "--sinks some unknown; choose from policy,kept,dropped"),
        (["--policies", "lru"], "--policies lru unknown"),
        (["--per-sequence"], "--per-sequence reads a prepared dataset's val split: add --dataset DIR"),
        (["--keys", "0"], "--keys 0: must be >= 1"),
        (["--passkey", "1,x"], "--passkey '1,x': expected a comma list of whole numbers"),
        (["--depths", "2"], "--depths '2': expected a comma list of numbers in"),
        (["--first", "10", "--budget", "25%"], r"--first 10 with --budget 25% \(10 entries\): the sinks would fill"),
        (["--eps", "1.5"], r"--eps 1.5: α lies in \[0, 1\], so ε must be in \[0, 1\)"),
        (["--first", "-1"], "--first -1: must be >= 0"),
        (["--max-tokens", "4"], "--max-tokens 4: must be >= 8"),
    ):
        with pytest.raises(SystemExit, match=message):
            kv_eval.main([*args[:5], *bad, "--out", str(tmp_path / "other")])
        assert not (tmp_path / "other").exists()
    with pytest.raises(SystemExit, match="already holds .* sinklab kv-eval of "):  # another model's files
        kv_eval.main(["smollm2", "--budget", "25%", "--out", str(out)])


def per_sequence_subject():
    model = micro_model(positional="learned", max_seq_len=8)
    return SimpleNamespace(kind="sinklab", model=model, max_positions=lambda: 8), SinkLabStreamer(model)


def test_per_sequence_full_cache_is_full_attention():
    subject, streamer = per_sequence_subject()
    ids = torch.randint(0, 64, (8,), generator=torch.Generator().manual_seed(6))
    full, _ = kv_eval.full_pass(subject, ids, eps=0.3, first=1)
    for row in kv_eval.stream_evicting(subject, streamer, ids, ROWS, 8, None)[0]:
        torch.testing.assert_close(row, full, atol=0, rtol=0)


def test_per_sequence_starts_each_sequence_from_an_empty_cache(monkeypatch):
    subject, streamer = per_sequence_subject()
    a, b = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(7))
    made = []
    monkeypatch.setattr(kv_eval, "Evictor", lambda *a, **k: made.append(Evictor(*a, **k)) or made[-1])
    settings = kv_eval.KvEval(
        [StreamingLLM()], ["keep", "drop"], ["50%"], 1, 0.3, True, True, [], [], 1, "no", 7, None, None
    )
    both = kv_eval.evaluate(subject, streamer, [a, b], settings).to_json()
    assert both["sequences"] == 2 and both["budgets"]["50"]["entries"] == 4 and len(made) == 2
    for evictor in made:  # 7 inputs through 4 entries: BOS and the last 3, or the last 4
        assert [h.pos[:, 0].tolist() for h in evictor.history] == [[[0, 4, 5, 6], [3, 4, 5, 6]]] * 2
    alone = [kv_eval.evaluate(subject, streamer, [s], settings).to_json() for s in (a, b)]
    for key in ("streaming/keep", "streaming/drop"):
        logs = [math.log(r["budgets"]["50"]["perplexity"][key]) for r in alone]
        assert math.log(both["budgets"]["50"]["perplexity"][key]) == pytest.approx(sum(logs) / 2)
    full = [math.log(r["full"]) for r in alone]
    assert math.log(both["full"]) == pytest.approx(sum(full) / 2)


def test_stream_positions_give_a_one_layer_model_the_kept_tokens_at_their_own_positions():
    model = micro_model(positional="learned", max_seq_len=8, n_layers=1)
    ids = torch.randint(0, 64, (8,), generator=torch.Generator().manual_seed(8))
    rows = [Row(StreamingLLM(), first=1, sinks=s) for s in ("keep", "drop")]
    evictor = Evictor(rows, 4, 1, model.config.n_heads)
    nll = SinkLabStreamer(model, stream_positions=True).nll(ids, [CacheSpec(0, 4)] * 2, evictor=evictor)
    for row, kept in zip(nll, ([0, 4, 5, 6], [3, 4, 5, 6])):  # the last input sees these 4 entries
        logits = model(ids[None, kept], positions=torch.tensor(kept)).logits[0, -1]
        assert row[-1].item() == pytest.approx(torch.nn.functional.cross_entropy(logits, ids[7]).item(), abs=1e-5)


PASSKEY = {"depths": [0.0, 1.0], "keys": 1, "bos_mode": "no"}


def hf_subject(model, tokenizer):
    return SimpleNamespace(kind="hf", model=model, tokenizer=tokenizer, max_positions=lambda: 512)


def test_passkey_through_a_cache_that_keeps_everything_is_the_full_cache_answer(tiny_llama, hf_tokenizer):
    def room(entries):  # past a 1x prompt and its answer: nothing is ever evicted
        trials = passkey.make_trials(hf_tokenizer, entries, [0.0, 1.0], 1)
        return entries - len(trials[0].ids) - max(passkey.answer_length(hf_tokenizer, t.key) for t in trials)

    entries = next(e for e in range(227, 400) if room(e) >= 0)
    trials = passkey.make_trials(hf_tokenizer, entries, [0.0, 1.0], 1)
    got = passkey_at(hf_subject(tiny_llama, hf_tokenizer), HFRotaryStreamer(tiny_llama), ROWS, entries, [1], **PASSKEY)
    (one,) = got.values()
    assert one["tokens"] == len(trials[0].ids) and [t["depth"] for t in one["trials"]] == [0.0, 1.0]
    assert len(one["answers"]) == len(ROWS) + 1 and all(a == one["answers"]["full"] for a in one["answers"].values())
    assert len(set(one["right"].values())) == 1


class CopyStreamer(Streamer):
    """A hand-made retriever over token ids: it predicts the token that followed the latest earlier
    occurrence of its last three cached tokens, so it writes the key exactly while the needle is cached."""

    device = torch.device("cpu")

    def stream(self, specs, evictor=None):
        cache = torch.zeros(len(specs), 0, dtype=torch.long)

        def feed(tokens):
            nonlocal cache
            if evictor is not None and (index := evictor.indices([cache[:, None, :, None].float()], tokens.shape[1])):
                cache = cache.gather(1, index[0][:, 0])
            logits = []
            for i in range(tokens.shape[1]):
                cache = torch.cat((cache, tokens[:, i : i + 1]), 1)
                logits.append(torch.stack([self.next_token(row.tolist()) for row in cache]))
            if evictor is not None:
                evictor.append(tokens.shape[1])
            return torch.stack(logits, 1)

        return feed

    @staticmethod
    def next_token(ids):
        out = torch.zeros(300)
        match = [j for j in range(len(ids) - 3) if ids[j : j + 3] == ids[-3:]]
        out[ids[match[-1] + 3] if match else 0] = 1  # 0: <unk>, which decodes to nothing
        return out


def test_passkey_fails_where_the_policy_evicts_the_key(hf_tokenizer):
    """2x prompts through 150 entries: StreamingLLM keeps the first 4 and the latest 146, so the key
    at depth 0 is gone by the question and the key at depth 1 is not; the whole cache finds both."""
    from tokenizers import decoders

    tokenizer = copy.deepcopy(hf_tokenizer)
    tokenizer.backend_tokenizer.decoder = decoders.ByteLevel()  # answers decode to text, " 60494"
    model = SimpleNamespace(config=SimpleNamespace(n_layers=1, n_heads=1, kv_heads=1))
    subject = SimpleNamespace(kind="sinklab", model=model, tokenizer=tokenizer, max_positions=lambda: None)
    rows = [Row(StreamingLLM(), first=4, sinks=s) for s in ("keep", "drop")]
    got = passkey_at(subject, CopyStreamer(), rows, 150, [2], **PASSKEY)
    (two,) = got.values()
    spans = passkey.build_trial(tokenizer, 300, 0.0, two["trials"][0]["key"]).key_spans
    assert all(4 <= a and b <= two["tokens"] - 146 for a, b in spans)  # depth 0: the key left the window
    assert two["right"] == {"streaming/keep": 1, "streaming/drop": 1, "full": 2}
    assert [first_number(a) for a in two["answers"]["full"]] == [t["key"] for t in two["trials"]]


def test_sinks_that_fill_the_smallest_budget_are_refused_before_any_model_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(kv_eval, "load_subject", lambda *a, **k: pytest.fail("a model was loaded"))
    argv = ["smollm2", "--first", "16", "--budget", "25%", "--budget", "8", "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as err:
        kv_eval.main(argv)
    assert str(err.value) == (
        "sinklab kv-eval: --first 16 with --budget 8 (8 entries): the sinks would fill the cache; "
        "need --first <= 6 (or a larger --budget)"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--snapkv.window", "0"], "--snapkv.window=0: the observation window needs at least 1 query"),
        (["--snapkv.pool_width", "4"], "--snapkv.pool_width=4: an odd width >= 1, centred on a key"),
        (
            ["--snapkv.window", "8", "--policies", "h2o"],
            "--snapkv.window: sets a policy that --policies h2o leaves out",
        ),
    ],
)
def test_bad_policy_settings_are_refused_in_one_line_before_any_model_loads(extra, message, tmp_path, monkeypatch):
    monkeypatch.setattr(kv_eval, "load_subject", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as err:
        kv_eval.main(["smollm2", *extra, "--out", str(tmp_path / "out")])
    assert str(err.value) == f"sinklab kv-eval: {message}" and not (tmp_path / "out").exists()


def test_each_policy_field_is_a_flag_explained_by_its_docstring(tmp_path):
    parser = kv_eval.build_parser()
    text = " ".join(parser.format_help().split())
    for name, cls in POLICIES.items():
        assert f"policy {name}: {' '.join(cls.__doc__.replace('``', '').split())}" in text
    assert "--snapkv.window WINDOW The observation window: the last queries whose attention ranks" in text
    assert "--snapkv.pool_width POOL_WIDTH Width of the average pooling over neighbouring keys" in text
    assert "(odd: centred on each key) (default: 5)" in text
    argv = ["smollm2", "--policies", "snapkv,h2o", "--snapkv.pool_width", "3", "--out", str(tmp_path)]
    s = kv_eval.check_args(parser.parse_args(argv))
    assert s.policies == [POLICIES["snapkv"](window=32, pool_width=3), POLICIES["h2o"]()]
    assert (s.destination.options["snapkv.window"], s.destination.options["snapkv.pool_width"]) == (32, 3)


def test_an_empty_text_is_named_too_short_before_the_full_pass(tiny_llama_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(kv_eval, "full_pass", lambda *a, **k: pytest.fail("work began"))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(SystemExit) as err:
        kv_eval.main([str(tiny_llama_dir), "--text", str(tmp_path / "empty.txt"), "--out", str(tmp_path / "out")])
    assert str(err.value).startswith(
        f"sinklab kv-eval: --text {tmp_path / 'empty.txt'}: 0 tokens (a BOS counted), empty"
    )
    assert "\n" not in str(err.value) and not (tmp_path / "out").exists()


def test_a_budget_past_the_model_positions_names_the_budget(sinklab_ckpt_with_tokenizer, tmp_path, monkeypatch):
    from analysis_helpers import WORDS

    monkeypatch.setattr(kv_eval, "full_pass", lambda *a, **k: pytest.fail("work began"))
    (tmp_path / "words.txt").write_text(" ".join(WORDS * 40))
    argv = [str(sinklab_ckpt_with_tokenizer), "--text", str(tmp_path / "words.txt"), "--max-tokens", "200"]
    with pytest.raises(SystemExit) as err:
        kv_eval.main([*argv, "--budget", "100", "--out", str(tmp_path / "out")])
    assert str(err.value).startswith("sinklab kv-eval: --budget 100: needs 100 positions, ")
    assert "handles at most 64" in str(err.value) and "--cache" not in str(err.value)
