"""Forward + backward of one attention layer with a learned sink logit, a K bias (fixed v*) or a KV
bias, against plain softmax, side by side in one process.

The last line is ``ratio=<the lowest speed ratio of any variant and T>`` (docs/gpu.md).
"""

from __future__ import annotations

import statistics
import time
import weakref

import torch
from side_by_side import arguments, interleaved
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from pipeline.model import ModelConfig
from pipeline.model.attention import Attention
from pipeline.model.masks import AttentionContext

VARIANTS = {
    "softmax": {},
    "sink logit": {"attention": {"sink_logit": True}},
    "K bias (v* fixed)": {"biases": {"kind": "k", "value_norm": 1.0}},
    "KV bias": {"biases": {"kind": "kv"}},
}


class LivePeak(TorchDispatchMode):
    """The most bytes held at once by the storages that ops return (each counted until freed)."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.now = self.peak = 0

    def _free(self, key: int) -> None:
        self.now -= self.live.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if storage.nbytes() and key not in self.live:
                    self.live[key] = storage.nbytes()
                    self.now += storage.nbytes()
                    weakref.finalize(storage, self._free, key)
        self.peak = max(self.peak, self.now)
        return out


def make_step(overrides: dict, heads: int, x: torch.Tensor, grad: torch.Tensor):
    """Forward + backward of an attention layer with ``overrides`` on ``x`` (1, T, d), of output gradient ``grad``."""
    T, d = x.shape[1:]
    cfg = ModelConfig.from_preset(
        "micro", d_model=d, n_heads=heads, n_layers=1, max_seq_len=T, positional="nope", **overrides
    )
    torch.manual_seed(0)
    layer = Attention(cfg).to(x.device, x.dtype)
    idx = torch.arange(T, device=x.device)
    ctx = AttentionContext(idx, idx, None, None, cfg, idx, idx, None, plain_causal=True)

    def step() -> None:
        y, _ = layer(x, ctx)
        y.backward(grad)
        layer.zero_grad(set_to_none=True)
        x.grad = None

    return step


def measure(steps: dict, repeats: int, device: str) -> tuple[dict[str, float], dict[str, int]]:
    """Median seconds per step and peak bytes per variant, variants interleaved in alternating order."""
    cuda = device == "cuda"
    peaks = {}
    for name, step in steps.items():  # warm-up and peak memory
        step()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            step()
            torch.cuda.synchronize()
            peaks[name] = torch.cuda.max_memory_allocated() - base
        else:
            with LivePeak() as probe:
                step()
            peaks[name] = probe.peak
    clock, sync = (time.perf_counter, torch.cuda.synchronize) if cuda else (time.process_time, lambda: None)
    seconds, _ = interleaved(steps, repeats, clock, sync)
    return {name: statistics.median(ts) for name, ts in seconds.items()}, peaks


def run(device: str, seqs: list[int], d: int, heads: int, repeats: int) -> float:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    worst = float("inf")
    print(f"\n{device} ({dtype}, d={d}, H={heads}, d_h={d // heads}, threads={torch.get_num_threads()})")
    print(f"{'T':>6}  {'variant':<18} {'ms/step':>9} {'peak MiB':>9} {'speed':>7} {'memory':>7}")
    for T in seqs:
        x = torch.randn(1, T, d, device=device, dtype=dtype, requires_grad=True)
        grad = torch.randn_like(x)  # the output's gradient, the same for every variant
        steps = {name: make_step(o, heads, x, grad) for name, o in VARIANTS.items()}
        secs, peaks = measure(steps, repeats, device)
        for name in VARIANTS:
            speed, memory = secs["softmax"] / secs[name], peaks[name] / peaks["softmax"]
            if name != "softmax":
                worst = min(worst, speed)
            print(
                f"{T:>6}  {name:<18} {secs[name] * 1e3:>9.1f} {peaks[name] / 2**20:>9.1f} {speed:>6.2f}x {memory:>6.2f}x"
            )
    return worst


def main() -> None:
    ap = arguments(__doc__, d_model=128, heads=2, cuda_d_model=2048, cuda_heads=32, repeats=3, threads=1)
    ap.add_argument("--seqs", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--cuda-only", action="store_true", help="skip the CPU part (gpu-check's bench-slots case)")
    args = ap.parse_args()
    if args.cuda_only and not torch.cuda.is_available():
        ap.error("--cuda-only: no CUDA device (torch.cuda.is_available() is False)")
    torch.set_num_threads(args.threads)
    worst = float("inf") if args.cuda_only else run("cpu", args.seqs, args.d_model, args.heads, args.repeats)
    if torch.cuda.is_available():
        worst = min(worst, run("cuda", args.seqs, args.cuda_d_model, args.cuda_heads, args.repeats))
    print(f"ratio={worst:.3f}")


if __name__ == "__main__":
    main()
