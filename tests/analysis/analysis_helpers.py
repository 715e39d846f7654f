"""Helpers shared by the analysis tests (imported by name; pytest puts this dir on sys.path)."""
import torch

from pipeline.analysis.inputs import shakespeare_files

HAMLET = next(f for f in shakespeare_files() if f.stem == "hamlet")


def micro_model(**overrides):
    from pipeline.model import ModelConfig, Transformer

    torch.manual_seed(0)
    return Transformer(ModelConfig.from_preset("micro", **overrides)).eval()
