"""`sinklab stream-ppl` end to end: its table and JSON, refused options, --bos."""

import json

import pytest
from analysis_helpers import HAMLET, micro_model

from pipeline.analysis import stream_ppl


def test_cli_on_local_llama(tiny_llama_dir, tmp_path, capsys):
    out = tmp_path / "ppl.json"
    args = [str(tiny_llama_dir), "--text", str(HAMLET), "--max-tokens", "20", "--cache", "1+7", "--full", "--out"]
    # a text that fits whole in a cache would evict nothing: refused, not printed as a streaming perplexity
    with pytest.raises(SystemExit, match="the text has 20 tokens, which fit whole in cache 0\\+32: nothing would be"):
        stream_ppl.main([*args, str(out), "--cache", "0+32"])
    assert not out.exists()
    assert stream_ppl.main([*args, str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["tokens"] == 20 and set(rec["perplexity"]) == {"1+7", "full"}
    assert "| model | 1+7 | full |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--cache"):
        stream_ppl.main([str(tiny_llama_dir), "--cache", "3"])
    # --out names a file sinklab did not write: refused before any work, the file unchanged
    mine = tmp_path / "mine.json"
    mine.write_text("my notes")
    with pytest.raises(SystemExit, match=f"--out {mine}: mine.json exists, which sinklab did not write"):
        stream_ppl.main([*args, str(mine)])
    assert mine.read_text() == "my notes"


def test_cli_on_a_sinklab_checkpoint_with_its_tokenizer(tmp_path, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers

    from pipeline.model import save_pretrained

    words = "<|bos|> <|eos|> the cat sat on a mat".split()
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="the"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    ckpt = save_pretrained(micro_model(), tmp_path / "ckpt")
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on a mat " * 5)
    out = tmp_path / "ppl.json"
    for bos, first in (("auto", True), ("no", False)):  # auto: BOS first, as in training
        assert (
            stream_ppl.main(
                [
                    str(ckpt),
                    "--text",
                    str(text),
                    "--cache",
                    "0+8",
                    "--cache",
                    "2+6",
                    "--full",
                    "--bos",
                    bos,
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        assert json.loads(out.read_text())["bos_first"] is first
    assert "| model | 0+8 | 2+6 | full |" in capsys.readouterr().out
    (tmp_path / "tokenizer.json").unlink()
    with pytest.raises(SystemExit, match="--tokenizer"):
        stream_ppl.main([str(ckpt), "--text", str(text)])


def test_bos_option(tiny_llama_dir, tmp_path):
    out = tmp_path / "ppl.json"
    args = [str(tiny_llama_dir), "--text", str(HAMLET), "--max-tokens", "12", "--cache", "0+8", "--out", str(out)]
    assert stream_ppl.main(args) == 0 and json.loads(out.read_text())["bos_first"] is False  # as its tokenizer does
    with pytest.raises(SystemExit, match="--bos yes: .* has no BOS token"):
        stream_ppl.main(args + ["--bos", "yes"])
    with pytest.raises(SystemExit, match="--bos applies to --text"):
        stream_ppl.main([str(tiny_llama_dir), "--dataset", str(tmp_path), "--bos", "yes"])
