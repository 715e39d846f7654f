"""The inputs of the analysis commands: a prepared dataset of another tokenizer is refused by every command
that reads one, in one line, before any work."""

import pytest
from analysis_helpers import micro_dataset

from pipeline.analysis import inputs
from pipeline.analysis.subject import Subject


@pytest.mark.parametrize(
    "command, extra",
    [
        ("kv-eval", []),
        ("kv-eval", ["--per-sequence"]),
        ("stream-ppl", []),
        ("length-eval", ["--train-len", "8", "--passkey", ""]),
    ],
)
def test_a_dataset_of_another_vocabulary_is_refused(command, extra, sinklab_ckpt_with_tokenizer, tmp_path, capsys):
    from pipeline.cli import main as sinklab

    other = micro_dataset(tmp_path / "other", vocab=48)
    out = tmp_path / "out"
    assert sinklab([command, str(sinklab_ckpt_with_tokenizer), "--dataset", str(other), *extra, "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"sinklab {command}: --dataset {other}: its tokenizer is not the model's (a vocabulary of 48 ids, the "
        "model's has 64); give the dataset the model was trained on (or one prepared with its tokenizer)\n"
    )
    assert not out.exists()


def test_a_dataset_of_the_model_vocabulary_passes(sinklab_ckpt_with_tokenizer, tmp_path):
    own = micro_dataset(tmp_path / "own")
    inputs.check_dataset_tokenizer(Subject(str(sinklab_ckpt_with_tokenizer), "auto", command="kv-eval"), own)
