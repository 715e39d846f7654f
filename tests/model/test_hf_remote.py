"""Every variant leaves SinkLab: one micro model of every registered attention op and
every slot kind is exported, then loaded with transformers' AutoModelForCausalLM in one fresh
process where SinkLab cannot be imported (hf_remote_check.py); its logits through ``forward`` and
through ``generate`` with the KV cache are SinkLab's (within 1e-5, fp32: those of ``generate`` against
SinkLab decoding on its own cache, and within 1e-4 (1 + |logit|) against recomputing the whole
sequence, which sums in another order), and its 32 greedy tokens are those of SinkLab recomputing
the whole sequence."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.kernels import triton_tiles
from pipeline.model import ModelConfig, StreamingCache, Transformer
from pipeline.model.attention_ops import OPS
from pipeline.model.hf_bundle import bundle, bundle_modules
from pipeline.model.hf_export import export_hf

transformers = pytest.importorskip("transformers")

PROMPT, NEW = 8, 32


def _op_variant(name: str) -> dict:
    normalizers = OPS[name].normalizers
    return {"attention": {"op": name, "normalizer": "abs_clamp" if "abs_clamp" in normalizers else normalizers[0]}}


# every op of the registry as imported (ops that later tests register and drop are not SinkLab's)
VARIANTS = {f"op_{name}": _op_variant(name) for name in OPS} | {
    "kernel_mlp": {"attention": {"op": "kernel", "feature_map": "mlp", "normalizer": "abs_clamp"}},
    "kernel_elu1": {"attention": {"op": "kernel", "feature_map": "elu1"}},
    "softmax_p2_alpha": {"attention": {"p": 2.0, "alpha": 1.5}},
    "sink_tokens_2": {"sink_tokens": 2},
    "kv_bias": {"biases": {"kind": "kv"}},
    "kv_bias_shared_key_dims": {"biases": {"kind": "kv", "shared_heads": True, "key_dims": 4}},
    "k_bias_fixed_value": {"biases": {"kind": "k", "value_norm": 2.0, "value_direction": "uniform"}},
    "v_bias": {"biases": {"kind": "v"}},
    "sink_logit": {"attention": {"sink_logit": True}},
    "sink_logit_kv_sliding": {
        "attention": {"sink_logit": True},
        "biases": {"kind": "kv"},
        "mask": "sliding",
        "window": 5,
    },
    "sink_tokens_sigmoid_kv": {"sink_tokens": 1, "biases": {"kind": "kv"}, "attention": {"op": "sigmoid"}},
    "gated_qk_norm": {"attention": {"gated": True, "qk_norm": True}},
    "gated_elementwise_post": {
        "attention": {"gated": True, "gate_granularity": "elementwise"},
        "norm_position": "post",
    },
    "qk_norm": {"attention": {"qk_norm": True}},
    "prefix_mask": {"mask": "prefix", "prefix_len": 3},
    "nope_post_layernorm_gelu": {"positional": "nope", "norm_position": "post", "norm": "layernorm", "ffn": "gelu"},
    "sinusoidal_sum_heads": {"positional": "sinusoidal", "head_merge": "sum", "ffn": "reglu"},
    "learned_tied": {"positional": "learned", "tie_embeddings": True, "sink_tokens": 1},
    "relative": {"positional": "relative"},
    "t5_geglu": {"positional": "t5", "ffn": "geglu"},
    "alibi_swish": {"positional": "alibi", "ffn": "swish", "sink_tokens": 1},
}


def _model(overrides: dict) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_preset("micro", init_std=0.2, **overrides)).eval()
    with torch.no_grad():  # every learned slot and gain away from its initial value, so each is tested
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "sink_logit")) or "kv_slot" in name or "value_bias" in name:
                p.add_(torch.randn_like(p))
    return model


def _greedy(model: Transformer, tokens: torch.Tensor) -> dict:
    """SinkLab's greedy continuation recomputing the whole sequence at every step, and the logits
    of the same steps decoded one token at a time on SinkLab's cache."""
    seq, full = tokens, []
    for _ in range(NEW):
        full.append(model(seq).logits[:, -1])
        seq = torch.cat([seq, full[-1].argmax(-1, keepdim=True)], dim=1)
    cache = StreamingCache(model.config, n_initial=0, n_recent=1 << 62)
    cached = [model(tokens, cache=cache).logits[:, -1]]
    cached += [model(seq[:, i : i + 1], cache=cache).logits[:, -1] for i in range(tokens.shape[1], seq.shape[1] - 1)]
    return {"greedy": seq, "full_logits": full, "cached_logits": cached}


@pytest.fixture(scope="module")
def remote_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    expected, kinds = {}, {}
    with torch.no_grad():
        for name, overrides in VARIANTS.items():
            model = _model(overrides)
            kinds[name] = export_hf(model, root / name)
            tokens = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(1))
            expected[name] = {"tokens": tokens, "logits": model(tokens).logits, "prompt": PROMPT}
            expected[name] |= _greedy(model, tokens[:1, :PROMPT])
    torch.save(expected, root / "expected.pt")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env |= {"HF_MODULES_CACHE": str(root / "hf_modules"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    check = Path(__file__).with_name("hf_remote_check.py")
    done = subprocess.run(
        [sys.executable, str(check), str(root)], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), kinds, root


def test_every_op_and_slot_kind_is_exact_through_forward_and_generate(remote_results):
    results, kinds, _ = remote_results
    assert set(results) == set(VARIANTS) and {f"op_{name}" for name in OPS} <= set(results)
    assert {name: r["problems"] for name, r in results.items() if r["problems"]} == {}
    assert max(r["gap"] for r in results.values()) <= 1e-5
    print("largest gaps:", max(r["gap"] for r in results.values()), max(r["relative"] for r in results.values()))


def test_native_where_an_hf_class_is_exact_remote_code_elsewhere(remote_results):
    results, kinds, root = remote_results
    native = {name: kind for name, kind in kinds.items() if kind != "remote code"}
    assert native == {"op_softmax": "LlamaForCausalLM", "qk_norm": "Qwen3ForCausalLM"}  # the default block
    assert {name: results[name]["class"] for name in native} == native
    assert {results[name]["class"] for name in kinds if name not in native} == {"SinkLabForCausalLM"}
    assert not (root / "op_softmax" / "hf_modeling.py").exists()


def test_the_bundled_source_is_the_tree_with_only_its_imports_made_relative(remote_results):
    _, _, root = remote_results
    export = root / "op_sigmoid"
    tree = Path(__file__).resolve().parents[2]
    shipped = {p.name: p.read_text() for p in export.glob("*.py")}
    assert shipped == bundle() and "hf_modeling.py" in shipped and "transformer.py" in shipped
    for module in bundle_modules():
        path = tree.joinpath(*module.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        name = module.rpartition(".")[2] + ".py"
        ours, theirs = path.read_text().splitlines(), shipped[name].splitlines()
        assert len(ours) == len(theirs), name
        changed = [(a, b) for a, b in zip(ours, theirs) if a != b]
        assert all(a.lstrip().startswith("from pipeline.") and b.lstrip().startswith("from .") for a, b in changed)


@pytest.mark.skipif(not triton_tiles.available(), reason="triton is not installed (a dev dependency)")
def test_loading_an_export_leaves_sinklabs_fused_kernels_callable(remote_results):
    """The export's bundled triton_tiles registers its custom ops beside SinkLab's, not over them."""
    _, _, root = remote_results
    script = f"""
import gc, torch
from transformers import AutoModelForCausalLM
from pipeline.kernels import triton_tiles
from pipeline.kernels.tiled import TileSpec, tiled_attention
AutoModelForCausalLM.from_pretrained({str(root / "op_sigmoid")!r}, trust_remote_code=True)
gc.collect()
q, k, v = torch.randn(3, 1, 2, 19, 16, dtype=torch.float64)
spec = TileSpec(similarity="sigmoid", score_factor=0.25)
gap = (triton_tiles.fused_tiled_attention(q, k, v, spec, blocks=(16, 16)) - tiled_attention(q, k, v, spec)).abs().max()
assert gap < 1e-12, gap
"""
    env = os.environ | {
        "HF_MODULES_CACHE": str(root / "hf_modules_kernels"),
        "HF_HUB_OFFLINE": "1",
        "TRITON_INTERPRET": "1",
    }
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
