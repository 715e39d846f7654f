"""Fixtures for the analysis tests: a small trained tokenizer, tiny random HF models saved as
local directories, the real SmolLM2 model (loaded once per session) and SinkLab micro models."""

import pytest
import torch
from analysis_helpers import HAMLET

from pipeline.analysis.inputs import read_text


@pytest.fixture(scope="session")
def hf_tokenizer():
    """A 300-token BPE trained on Hamlet, as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([read_text(HAMLET)[:60000]], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", unk_token="<unk>")


def _save(model, tokenizer, path):
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, hf_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(hf_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return _save(LlamaForCausalLM(cfg), hf_tokenizer, tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tmp_path_factory, hf_tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=len(hf_tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=64)
    model = GPT2LMHeadModel(cfg)
    with torch.no_grad():  # a distinctive p_1 so that position edits visibly move attention
        model.transformer.wpe.weight[0] *= 20.0
    return _save(model, hf_tokenizer, tmp_path_factory.mktemp("tiny_gpt2"))


@pytest.fixture(scope="session")
def smollm2():
    from pipeline.analysis.subject import Subject

    return Subject("smollm2", "auto")
