"""Simulated W8A8 (pipeline.analysis.fake_quant) and `sinklab quant-eval`."""

import json

import pytest
import torch
from analysis_helpers import BOS, MLP_FEATURE_MAP, greedy_windows, micro_model, planted_model

from pipeline.analysis import quant_eval
from pipeline.analysis.fake_quant import SETTINGS, fake_quantized, quantize_activation, quantize_weight


def test_weights_per_output_channel_by_hand():
    w = torch.tensor([[1.27, -0.5, 0.004], [0.0, 2.54, -1.0]])
    # row steps 0.01 and 0.02: -0.5 -> -50 steps, 0.004 -> 0; -1.0 -> -50 steps
    expected = torch.tensor([[1.27, -0.5, 0.0], [0.0, 2.54, -1.0]])
    torch.testing.assert_close(quantize_weight(w), expected)


def test_activations_per_tensor_per_token_and_without_the_lead():
    x = torch.tensor([[[127.0, 0.4], [1.0, -0.6]]])  # [B=1, T=2, d=2]
    # per tensor: one step of 1.0 for the whole sequence, so 0.4 -> 0 and -0.6 -> -1
    torch.testing.assert_close(quantize_activation(x, "tensor"), torch.tensor([[[127.0, 0.0], [1.0, -1.0]]]))
    # per token: token 2 gets a step of 1/127 and keeps its values to within half a step
    per_token = quantize_activation(x, "token")
    assert per_token[0, 0].tolist() == [127.0, 0.0] and (per_token[0, 1] - x[0, 1]).abs().max() <= 0.5 / 127
    # the step from position 2 on: the first token saturates at ±127 steps of 1/127
    excluded = quantize_activation(x, "tensor", skip=1)
    assert excluded[0, 0, 0].item() == pytest.approx(1.0) and (excluded[0, 1] - x[0, 1]).abs().max() <= 0.5 / 127


def test_a_per_head_input_has_one_step_per_sequence_over_its_heads_and_positions_on_dim_minus_2():
    x = torch.tensor([[[[127.0, 0.4], [1.0, -0.6]], [[2.0, 0.0], [0.3, 0.0]]]])  # [B=1, H=2, T=2, d=2]
    # per tensor: one step of 1.0 for both heads, so head 2's 0.3 -> 0
    torch.testing.assert_close(quantize_activation(x, "tensor")[0, 1], torch.tensor([[2.0, 0.0], [0.0, 0.0]]))
    # without position 1 (127 and 2.0): the step is 1/127 for both heads
    assert (quantize_activation(x, "tensor", skip=1)[0, :, 1] - x[0, :, 1]).abs().max() <= 0.5 / 127
    with pytest.raises(ValueError, match=r"\[B, T, d\] or \[B, H, T, d_h\], got \(2, 2\)"):
        quantize_activation(x[0, 0], "tensor")


def test_the_mlp_feature_map_s_per_head_linears_are_quantized_too_and_intact_keeps_the_first_position():
    model = micro_model(attention=MLP_FEATURE_MAP)
    ids = torch.randint(3, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
        with fake_quantized(model.blocks, SETTINGS["w8a8-tensor-intact"], lead=1) as n:
            intact = model(ids).logits
        # per block: attn.qkv, attn.out, attn.feature_map.fc1, attn.feature_map.fc2, ffn.gate_up, ffn.down
        assert n == 2 * 6
        with fake_quantized(model.blocks, SETTINGS["w8a8-tensor"]):
            quantized = model(ids).logits
    torch.testing.assert_close(intact[:, 0], before[:, 0])  # position 0: every linear input kept
    assert not torch.equal(quantized[:, 0], before[:, 0]) and not torch.equal(intact, before)


def test_fake_quantization_is_undone_on_exit():
    model = micro_model()
    ids = torch.randint(3, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
        with pytest.raises(RuntimeError), fake_quantized(model.blocks, SETTINGS["w8a8-tensor"]) as n:
            assert n == 2 * 4  # per block: attn.qkv, attn.out, ffn.gate_up, ffn.down
            assert not torch.equal(model(ids).logits, before)
            raise RuntimeError("leave early")
        assert torch.equal(model(ids).logits, before)


def test_intact_is_intactkv_the_quantized_model_attends_to_the_full_precision_first_token():
    from pipeline.model import StreamingCache

    model = planted_model()
    ids = greedy_windows(model, 3, 16)
    with torch.no_grad():
        with fake_quantized(model.blocks, SETTINGS["w8a8-tensor-intact"], lead=1):
            intact = model(ids).logits
        cache = StreamingCache(model.config, n_initial=0, n_recent=64)
        first = model(ids[:, :1], cache=cache).logits  # the pivot token's KV from the full-precision model
        with fake_quantized(model.blocks, SETTINGS["w8a8-tensor"]):
            rest = model(ids[:, 1:], cache=cache).logits
    torch.testing.assert_close(intact, torch.cat((first, rest), 1), atol=1e-4, rtol=1e-4)


def perplexities(model, windows):
    results, _ = quant_eval.Evaluator(model, "sinklab", windows, lead=1, batch_size=4).run(list(SETTINGS))
    return {name: r["perplexity"] for name, r in results.items()}, results


def test_one_planted_massive_activation_breaks_per_tensor_w8a8_and_keeping_that_token_restores_it():
    model = planted_model()
    windows = greedy_windows(model, 8, 32)
    ppl, results = perplexities(model, windows)
    fp = ppl["fp"]
    assert ppl["w8a8-tensor"] > 10 * fp  # the BOS's ~1000 sets the step: everything else rounds to 0
    for name in ("w8a8-token", "w8a8-tensor-intact", "w8a8-token-intact", "w8a8-tensor-exclude"):
        assert ppl[name] < 1.05 * fp, name
    assert results["w8a8-tensor-intact"]["recovered_pct"] > 99 and results["w8a8-tensor-exclude"]["recovered_pct"] > 99
    # the control: without the planted unit per-tensor W8A8 is as good as the rest
    control, _ = perplexities(planted_model(magnitude=1e-3), windows)
    assert control["fp"] == pytest.approx(fp) and control["w8a8-tensor"] < 1.05 * fp


def test_make_windows_and_the_scored_predictions():
    assert quant_eval.make_windows(list(range(10, 20)), 4, BOS).tolist() == [
        [BOS, 10, 11, 12],
        [BOS, 13, 14, 15],
        [BOS, 16, 17, 18],
    ]
    assert quant_eval.make_windows(list(range(10, 19)), 4, None).tolist() == [[10, 11, 12, 13], [14, 15, 16, 17]]
    model = micro_model(sink_tokens=2)
    windows = torch.randint(3, 64, (2, 10), generator=torch.Generator().manual_seed(0))
    evaluator = quant_eval.Evaluator(model, "sinklab", windows, lead=3)
    assert evaluator.nll("fp").shape == (2, 8)  # the prediction made from the first real token is not scored
    logits = model(windows).logits
    expected = torch.nn.functional.cross_entropy(logits[:, 1:-1].transpose(1, 2), windows[:, 2:], reduction="none")
    torch.testing.assert_close(evaluator.nll("fp"), expected)


def test_smollm2_table_and_json(smollm2, tmp_path):
    argv = ["smollm2", "--max-tokens", "128", "-T", "64", "--batch-size", "2", "--out", str(tmp_path)]
    result = quant_eval.run(smollm2, quant_eval.check_args(quant_eval.build_parser().parse_args(argv)))
    saved = json.loads((tmp_path / "quant_eval.json").read_text())
    assert saved["settings"] == result["settings"] and saved["settings"]["windows"] == 2
    assert (
        saved["settings"]["scored"] == 2 * 62 and saved["settings"]["lead"] == 1 and not saved["settings"]["bos_first"]
    )
    results = saved["results"]
    assert list(results) == list(SETTINGS)
    assert results["fp"]["gap_pct"] == 0.0 and 5 < results["fp"]["perplexity"] < 100
    # SmolLM2's first token carries a massive activation: per-tensor W8A8 loses most, keeping it intact wins back
    assert results["w8a8-tensor"]["gap_pct"] > 20 and results["w8a8-tensor-intact"]["recovered_pct"] > 50
    summary = saved["outliers"]["summary"]
    assert summary["lead_pct"] == 100.0 and summary["max_abs"] > 1000 and summary["linear_max_at"].endswith("down_proj")
    table = (tmp_path / "quant_eval.md").read_text()
    assert table.startswith("smollm2: perplexity of 124 predictions (2 windows of 64 tokens, no BOS;")
    assert f"| w8a8-tensor | {results['w8a8-tensor']['perplexity']:.3f} |" in table and "| smollm2 |" in table


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--settings", "fp,w4a4"], "sinklab quant-eval: --settings w4a4 unknown; choose from fp,w8a8-tensor,"),
        (["--lead", "0"], "sinklab quant-eval: --lead 0: must cover the 0 sink token(s)"),
        (["--max-tokens", "5"], "tokens do not fill one window of 64"),
        (["--text", "x.txt", "--dataset", "d"], "sinklab quant-eval: give --text or --dataset, not both"),
    ],
)
def test_refusals_are_one_line(extra, message, tiny_llama_dir, tmp_path, capsys):
    from pipeline.cli import main as sinklab

    text = tmp_path / "t.txt"
    text.write_text("To be, or not to be, that is the question. " * 4)
    argv = ["quant-eval", str(tiny_llama_dir), "-T", "64", "--text", str(text), "--out", str(tmp_path / "out"), *extra]
    if "--dataset" in extra:
        argv = [a for a in argv if a != str(text)]
        argv.remove("--text")
    assert sinklab(argv) == 2
    refusal = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' loading bar
    assert refusal.startswith("sinklab quant-eval: ") and message in refusal
    assert not (tmp_path / "out").exists()


def test_a_training_run_gets_the_results_back(mlflow_server, tmp_path, monkeypatch, capsys):
    """runs:/<id> of a run whose model is the planted one: the table, and the figures on the run."""
    from mlflow.tracking import MlflowClient
    from tokenizers import Tokenizer, models, pre_tokenizers

    from pipeline.model import save_pretrained

    model = planted_model()
    words = ["<|pad|>", "<|bos|>", "<|eos|>", "[UNK]"] + [f"w{i}" for i in range(4, 64)]
    model_dir = save_pretrained(model, tmp_path / "model")
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(model_dir / "tokenizer.json"))
    windows = greedy_windows(model, 4, 32)
    text = tmp_path / "greedy.txt"  # cut into windows of BOS + 31 tokens, it gives back the greedy windows
    text.write_text(" ".join(words[i] for row in windows for i in row[1:].tolist()))
    client = MlflowClient(mlflow_server)
    run_id = client.create_run(client.create_experiment("quant-eval")).info.run_id
    client.log_artifacts(run_id, str(model_dir), artifact_path="model")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("SINKLAB_CACHE", str(tmp_path / "cache"))

    assert quant_eval.main([f"runs:/{run_id}", "--text", str(text), "-T", "32", "--out", str(tmp_path / "out")]) == 0
    assert f"logged to MLflow run {run_id}" in capsys.readouterr().out
    saved = json.loads((tmp_path / "out" / "quant_eval.json").read_text())
    assert saved["settings"]["windows"] == 4 and saved["settings"]["bos_first"] and saved["mlflow_run_id"] == run_id
    results = saved["results"]
    assert results["w8a8-tensor"]["gap_pct"] > 500 and results["w8a8-tensor-intact"]["recovered_pct"] > 99
    logged = client.get_run(run_id).data
    assert logged.metrics["quant/perplexity_w8a8_tensor"] == pytest.approx(results["w8a8-tensor"]["perplexity"])
    assert logged.metrics["quant/recovered_pct_w8a8_tensor_intact"] == pytest.approx(
        results["w8a8-tensor-intact"]["recovered_pct"]
    )
    assert logged.metrics["quant/act/linear_max"] > 900
    assert json.loads(logged.tags["sinklab.quant.settings"])["lead"] == 1
    assert {a.path for a in client.list_artifacts(run_id, "quant")} == {"quant/quant_eval.json", "quant/quant_eval.md"}
