"""`sinklab length-eval` on a SinkLab checkpoint and a tiny HF llama: the table, figure, JSON and
MLflow runs, the streaming rows equal to full attention where nothing is evicted, the refusals."""

import json

import pytest
import torch
from analysis_helpers import micro_model

from pipeline import cli
from pipeline.analysis import length


@pytest.fixture(scope="module")
def sinklab_ckpt(tmp_path_factory, hf_tokenizer):
    from pipeline.model import save_pretrained

    root = tmp_path_factory.mktemp("length")
    hf_tokenizer.backend_tokenizer.save(str(root / "tokenizer.json"))
    return save_pretrained(micro_model(vocab_size=len(hf_tokenizer), init_std=0.1), root / "ckpt")


def test_length_eval_of_a_sinklab_checkpoint_and_an_hf_model(sinklab_ckpt, tiny_llama_dir, tmp_path, mlflow_server):
    out = tmp_path / "out"
    argv = [str(sinklab_ckpt), str(tiny_llama_dir), "--train-len", "16", "--factor", "3", "--windows", "2"]
    argv += ["--passkey", "2,16", "--keys", "1", "--depths", "0,1", "--out", str(out), "--mlflow-uri", mlflow_server]
    assert length.main(argv) == 0
    saved = json.loads((out / "length.json").read_text())
    assert list(saved["models"]) == ["ckpt", tiny_llama_dir.name]
    for result in saved["models"].values():
        assert result["train_len"] == 16 and result["bucket"] == 8 and result["tokens"] == 48
        loss = result["loss"]
        assert set(loss) == {"full", "0+16", "1+15"} and all(len(v) == 6 for v in loss.values())
        for mode in ("0+16", "1+15"):  # within C nothing is evicted: the cache sees what full attention sees
            assert loss[mode][:2] == pytest.approx(loss["full"][:2], rel=1e-4)
        assert loss["0+16"][3:] != pytest.approx(loss["full"][3:], rel=1e-4)  # beyond C it does not
        assert result["passkey"]["full"]["2"] is None  # 32 tokens cannot hold the prompt
        assert all(0 <= row["16"] <= 100 for row in result["passkey"].values())
    table = (out / "length.md").read_text()
    assert table.count("| ckpt | 16 |") == 3 and "| passkey 16x |" in table and "0-0.5C" in table
    assert (out / "length.png").read_bytes()[:4] == b"\x89PNG"
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=mlflow_server)
    runs = client.search_runs(
        [client.get_experiment_by_name("sinklab-analysis").experiment_id], "tags.`sinklab.kind` = 'length-eval'"
    )
    ckpt_run = next(r for r in runs if r.data.tags["sinklab.model"] == "ckpt")
    assert ckpt_run.data.metrics["length/loss_full_b0"] == pytest.approx(saved["models"]["ckpt"]["loss"]["full"][0])
    assert "length/passkey_1_15_x16" in ckpt_run.data.metrics and "length/passkey_full_x2" not in ckpt_run.data.metrics


def test_loss_buckets_by_target_position():
    class Fixed:
        def full_nll(self, ids):
            return torch.arange(1.0, ids.numel())  # NLL index j: the loss of target position j + 1

        def nll(self, ids, specs):
            return torch.zeros(len(specs), ids.numel() - 1)

    buckets = length.loss_by_position(Fixed(), torch.zeros(2, 7, dtype=torch.long), [], bucket=3)
    assert buckets["full"] == pytest.approx([(1 + 2) / 2, (3 + 4 + 5) / 3, 6.0])  # targets 1-2, 3-5, 6


def test_a_result_is_its_json_its_metrics_and_its_table():
    passkey = {"full": {2: 100.0, 4: None}, "1+7": {2: 50.0, 4: None}}
    loss = {"full": [2.0, 3.0], "1+7": [2.0, 4.0]}
    result = length.LengthResult(8, 4, 16, 2, True, ["1+7"], loss, passkey, 0.5)
    saved = json.loads(json.dumps(result.to_json()))
    assert saved["passkey"] == {"full": {"2": 100.0, "4": None}, "1+7": {"2": 50.0, "4": None}}
    assert saved["loss"] == loss and saved["train_len"] == 8 and saved["seconds"] == 0.5
    assert result.settings() == {
        "train_len": 8,
        "bucket": 4,
        "tokens": 16,
        "windows": 2,
        "bos": True,
        "caches": ["1+7"],
    }
    assert result.metrics() == {
        "length/loss_full_b0": 2.0,
        "length/loss_full_b1": 3.0,
        "length/loss_1_7_b0": 2.0,
        "length/loss_1_7_b1": 4.0,
        "length/passkey_full_x2": 100.0,
        "length/passkey_1_7_x2": 50.0,
    }
    table = length.markdown({"m": result}).splitlines()
    assert table[2] == "| model | C | mode | 0-0.5C | 0.5-1C | passkey 2x | passkey 4x |"
    assert table[5] == "| m | 8 | 1+7 | 2.000 | 4.000 | 50 | n/a |"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--passkey", "1,x"], "--passkey '1,x': expected a comma list of whole numbers"),
        (["--factor", "0"], "--factor 0: must be >= 1"),
        (["--text", "a.txt", "--dataset", "d"], "give --text or --dataset, not both"),
        ([], "--train-len is needed for a Hugging Face model"),
        # checked before the model loads (--digits 0 crashed in the passkey after the loss was computed)
        (["--passkey", "4", "--digits", "0"], "--digits 0: must be in 1..18"),
        (["--depths", "x"], "--depths 'x': expected a comma list of numbers in [0, 1]"),
    ],
)
def test_refusals_are_one_line_and_write_nothing(extra, message, tiny_llama_dir, tmp_path, capsys):
    assert cli.main(["length-eval", str(tiny_llama_dir), "--out", str(tmp_path / "o"), *extra]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' loading bar, if any
    assert last.startswith("sinklab length-eval: ") and message in last
    assert not (tmp_path / "o").exists()


def test_learned_positions_refuse_a_length_past_their_table(tmp_path, hf_tokenizer, capsys):
    from pipeline.model import save_pretrained

    hf_tokenizer.backend_tokenizer.save(str(tmp_path / "tokenizer.json"))
    ckpt = save_pretrained(micro_model(vocab_size=len(hf_tokenizer), positional="learned"), tmp_path / "ckpt")
    assert cli.main(["length-eval", str(ckpt), "--train-len", "32", "--passkey", "", "--out", str(tmp_path / "o")]) == 2
    assert "learned positions end at 64; 128 tokens are asked" in capsys.readouterr().err


def test_length_eval_reads_a_bigram_backcopy_model_on_fresh_long_sequences(tmp_path, capsys):
    """``--dataset`` of a BB dataset: windows of k·C tokens are fresh sequences of its chain, BOS
    first (not its val split of C-token rows run together, BOS every C tokens)."""
    from data_prep.cli import main as prep
    from pipeline.model import save_pretrained

    bb = tmp_path / "bb"
    assert (
        prep(["bb", "--out", str(bb), "-C", "8", "--sequences", "4", "--val-sequences", "4", "--probe-length", "8"])
        == 0
    )
    ckpt = save_pretrained(micro_model(vocab_size=32), tmp_path / "ckpt")
    out = tmp_path / "out"
    argv = [str(ckpt), "--dataset", str(bb), "--train-len", "8", "--factor", "3", "--windows", "3", "--passkey", ""]
    assert length.main([*argv, "--out", str(out)]) == 0
    result = json.loads((out / "length.json").read_text())["models"]["ckpt"]
    assert result["tokens"] == 24 and result["windows"] == 3 and len(result["loss"]["full"]) == 6
    ids = length.bb_windows(length.check_args(length.build_parser().parse_args(argv)), 24)
    assert ids.shape == (3, 24) and (ids[:, 0] == 30).all() and (ids[:, 1:] < 30).all()  # BOS (id 30) once
    assert cli.main(["length-eval", *argv, "--bos", "no", "--out", str(tmp_path / "o")]) == 2
    assert "a Bigram-Backcopy sequence starts with BOS" in capsys.readouterr().err


def test_a_users_file_in_out_is_refused_before_any_work(tiny_llama_dir, tmp_path, capsys, monkeypatch):
    """--out's length.md / length.json / length.png go through sinklab_io.outputs."""
    from pipeline.analysis import subject

    monkeypatch.setattr(subject, "Subject", lambda *a, **k: pytest.fail("a model was loaded"))
    out = tmp_path / "o"
    out.mkdir()
    (out / "length.md").write_text("the user's notes")
    assert cli.main(["length-eval", str(tiny_llama_dir), "--train-len", "16", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"sinklab length-eval: --out {out}: already holds length.md, which sinklab did not write (or which changed "
        "since); nothing was changed. Name a new directory, or move those files away"
    ]
    assert [p.name for p in out.iterdir()] == ["length.md"] and (out / "length.md").read_text() == "the user's notes"
