"""Fixed-seed probes whose every logged value tests/probe_values.json holds (test_probe.py)."""

import torch
from analysis_helpers import BOS, planted_model

from pipeline.flow import TRAINING_MIXING_SEQUENCES
from pipeline.model import ModelConfig, Transformer
from pipeline.probe import run_probe


def micro(**overrides) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig.from_preset("micro", **overrides))


CASES = {
    "softmax, triggers": (lambda: micro(attention={"op": "softmax"}), {"trigger_ids": [5, 9], "output_qkv": True}),
    "elu+1 kernel": (lambda: micro(attention={"op": "kernel", "feature_map": "elu1"}), {}),
    "K-bias slot, one sink token": (lambda: micro(biases={"kind": "k"}, sink_tokens=1), {}),
    "planted massive activation": (planted_model, {}),
}


def logged_values(case: str) -> dict[str, float]:
    """What training logs of one probe (``to_metrics() | head_metrics()``) of a seeded micro model
    on 50 seeded sequences of 48 tokens that start with BOS, flow on the first 25 as in training."""
    build, probe_args = CASES[case]
    tokens = torch.randint(2, 64, (50, 48), generator=torch.Generator().manual_seed(1))
    tokens[:, 0] = BOS
    measures = run_probe(build(), tokens, mixing_sequences=TRAINING_MIXING_SEQUENCES, **probe_args)
    return measures.to_metrics() | measures.head_metrics()
