"""Helpers shared by the analysis tests (imported by name; pytest puts this dir on sys.path)."""

import torch

from pipeline.analysis.inputs import shakespeare_files

HAMLET = next(f for f in shakespeare_files() if f.stem == "hamlet")
WORDS = "the cat dog sat on mat a red blue sky is sea green grass".split()  # the micro checkpoint's word tokenizer


def micro_model(**overrides):
    from pipeline.model import ModelConfig, Transformer

    torch.manual_seed(0)
    return Transformer(ModelConfig.from_preset("micro", **overrides)).eval()


# per-head linears: [B, H, T, d_h] inputs
MLP_FEATURE_MAP = {"op": "kernel", "feature_map": "mlp", "normalizer": "none"}


BOS = 1  # the planted model's "BOS": the only token whose embedding has channel 0


def planted_model(magnitude: float = 1000.0):
    """A micro SinkLab model with ONE planted massive activation: unit 0 of layer 0's FFN reads
    residual channel 0, which only the BOS embedding has (100.0; layer 0's attention writes none
    into it), so that unit's output, the down projection's input, is ≈ ``magnitude`` at BOS and 0
    elsewhere. Its down column is zero: the full-precision model does not use it; only an int8 step
    computed over that input sees it. Weights are drawn larger than at init (std 0.1, layer 0's
    FFN output x10, logits x3) so that predictions are confident and lean on layer 0's FFN."""
    from pipeline.model import ModelConfig, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("micro", init_std=0.1)).eval()
    ffn = model.blocks[0].ffn
    d_ffn = ffn.down.weight.shape[1]
    gain = (magnitude / model.config.d_model) ** 0.5  # (gain · √d)² = magnitude at BOS after the norm
    with torch.no_grad():
        model.embed.weight[:, 0] = 0.0
        model.embed.weight[BOS, 0] = 100.0
        model.blocks[0].attn.out.weight[0] = 0.0
        ffn.down.weight *= 10.0
        ffn.down.weight[:, 0] = 0.0
        for row in (0, d_ffn):  # gate and up rows of unit 0
            ffn.gate_up.weight[row] = 0.0
            ffn.gate_up.weight[row, 0] = gain
        model.lm_head.weight *= 3.0
    return model


def greedy_windows(model, n: int, seq_len: int, seed: int = 1) -> torch.Tensor:
    """``n`` windows [BOS, a random token, the model's greedy continuation (never BOS)]."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.cat([torch.full((n, 1), BOS), torch.randint(3, model.config.vocab_size, (n, 1), generator=g)], 1)
    with torch.no_grad():
        while ids.shape[1] < seq_len:
            logits = model(ids).logits[:, -1]
            logits[:, BOS] = -torch.inf
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], 1)
    return ids


def micro_dataset(root, vocab: int = 64):
    """A packed dataset of ``vocab`` ids beside a micro checkpoint's tokenizer.json (copied in as its own)."""
    from packed_datasets import make_dataset

    root = make_dataset(root, probe=(8, 12), V=vocab)
    (root / "tokenizer.json").write_bytes((root.parent / "tokenizer.json").read_bytes())
    return root
