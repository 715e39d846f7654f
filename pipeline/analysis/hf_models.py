"""Pretrained Hugging Face causal LMs for analysis, from what ``pipeline.model.hf_sources`` resolves."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.model.hf_sources import hf_directory


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    source: str  # where the weights came from (directory, GGUF file or hub name)


def load_hf_model(spec: str) -> LoadedModel:
    """``spec`` (a shortcut, a ``.gguf`` file, an HF model directory or a hub name) in fp32, eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.analysis.hf_capture import ensure_registered

    ensure_registered()
    source, directory = hf_directory(spec)
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32, attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model.eval()
    return LoadedModel(model=model, tokenizer=tokenizer, source=source)
