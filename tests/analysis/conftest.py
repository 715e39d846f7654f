"""Fixtures for the analysis tests: the real SmolLM2 model (loaded once per session), a micro SinkLab checkpoint
with a word-level tokenizer."""

import pytest


@pytest.fixture(scope="session")
def smollm2():
    from pipeline.analysis.subject import Subject

    return Subject("smollm2", "auto")


@pytest.fixture()
def sinklab_ckpt_with_tokenizer(tmp_path):
    """A micro SinkLab checkpoint with a word-level tokenizer.json (SinkLab's special names) beside it."""
    from analysis_helpers import WORDS, micro_model
    from tokenizers import Tokenizer, models, pre_tokenizers

    from pipeline.model import save_pretrained

    vocab = {w: i for i, w in enumerate(["<|bos|>", "<|eos|>", "<|pad|>", "[UNK]", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    return save_pretrained(micro_model(), tmp_path / "ckpt")
