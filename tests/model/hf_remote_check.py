"""Run by tests/model/test_hf_remote.py in a fresh interpreter where SinkLab cannot be imported:
loads every export under argv[1] with transformers' AutoModelForCausalLM and checks its logits and
greedy generation (with the KV cache) against SinkLab's, stored beside it (expected.pt). Prints
one JSON line: per export, the class it loaded as, the largest logit gaps, and the problems found."""

import importlib.util
import json
import os
import sys
from pathlib import Path

# no SinkLab: neither its editable install's finder nor a path entry that holds the package
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
sys.path[:] = [p for p in sys.path if not os.path.isdir(os.path.join(p or os.getcwd(), "pipeline"))]
assert importlib.util.find_spec("pipeline") is None, "pipeline is importable"

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

TOLERANCE = 1e-5
RECOMPUTE_TOLERANCE = 1e-4  # a cache and a full recompute sum in different orders (fp32 rounding)
root = Path(sys.argv[1])
expected = torch.load(root / "expected.pt")
results = {}
for name, ref in expected.items():
    model = AutoModelForCausalLM.from_pretrained(root / name, trust_remote_code=True, dtype=torch.float32).eval()
    problems, lengths = [], []
    forward = model.forward
    model.forward = lambda *a, _f=forward, _n=lengths, **kw: _n.append(kw["input_ids"].shape[1]) or _f(*a, **kw)
    with torch.no_grad():
        gap = (model(input_ids=ref["tokens"]).logits - ref["logits"]).abs().max().item()
        lengths.clear()
        prompt = ref["tokens"][:1, : ref["prompt"]]
        out = model.generate(
            prompt,
            max_new_tokens=ref["greedy"].shape[1] - prompt.shape[1],
            do_sample=False,
            return_dict_in_generate=True,
            output_logits=True,
            pad_token_id=0,
        )
    # relative (1 + |logit|), as fp32 rounding grows with the logit and with the loaded weights' alignment
    step_gap = max(((a - b).abs() / (1 + b.abs())).max().item() for a, b in zip(out.logits, ref["cached_logits"]))
    full_gap = max(((a - b).abs() / (1 + b.abs())).max().item() for a, b in zip(out.logits, ref["full_logits"]))
    if gap > TOLERANCE:
        problems.append(f"forward logits differ by {gap:.2e}")
    if step_gap > TOLERANCE:
        problems.append(f"generate's logits differ from SinkLab's cached decoding by {step_gap:.2e} (1 + |logit|)")
    if full_gap > RECOMPUTE_TOLERANCE:
        problems.append(f"generate's logits differ from SinkLab's full recompute by {full_gap:.2e} (1 + |logit|)")
    if not torch.equal(out.sequences, ref["greedy"]):
        problems.append(f"greedy tokens differ: {out.sequences.tolist()} vs {ref['greedy'].tolist()}")
    if lengths[1:] != [1] * (len(lengths) - 1) or lengths[0] != prompt.shape[1]:
        problems.append(f"generate did not run on its cache: token counts per step {lengths}")
    results[name] = {
        "class": type(model).__name__,
        "gap": max(gap, step_gap),
        "relative": full_gap,
        "problems": problems,
    }
print(json.dumps(results))
