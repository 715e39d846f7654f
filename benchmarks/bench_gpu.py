"""GPU training speed side by side in one process (`make bench-gpu`).

The last line is ``ratio=<SinkLab tokens/s over HF tokens/s, 1B>`` (docs/gpu.md); without CUDA it runs toy shapes.
"""

from __future__ import annotations

import gc
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from side_by_side import arguments, interleaved, train_step
from transformers import LlamaForCausalLM

from pipeline.flops import device_peak_flops, flops_per_token, mfu
from pipeline.kernels import blocked_attention, triton_tiles
from pipeline.model import ModelConfig, Transformer
from pipeline.model.attention_ops import OPS, blocked_spec
from pipeline.model.hf_native import hf_config
from pipeline.train.loss import linear_cross_entropy

TINY_SHAPES = {  # stand-ins for the presets on a CPU
    "llama-60m": dict(d_model=64, n_layers=2, n_heads=4, d_ffn=128),
    "llama-1b": dict(d_model=96, n_layers=2, n_heads=6, d_ffn=192),
}


@dataclass
class Result:
    name: str
    batch: int
    tokens_per_s: float
    mfu: float | None
    peak_bytes: int | None

    def line(self) -> str:
        util = "n/a" if self.mfu is None else f"{100 * self.mfu:.1f}%"
        mem = "n/a" if self.peak_bytes is None else f"{self.peak_bytes / 2**30:.2f}GiB"
        return (
            f"case={self.name:<28} micro_batch={self.batch:<3} tokens/s={self.tokens_per_s:>12,.0f} "
            f"mfu={util:>6} peak_mem={mem}"
        )


class Bench:
    def __init__(self, device: torch.device, context: int, steps: int, warmup: int, max_batch: int):
        self.device, self.context, self.steps, self.warmup, self.max_batch = device, context, steps, warmup, max_batch
        self.cuda = device.type == "cuda"
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.peak = device_peak_flops() if self.cuda else None

    def _free(self) -> None:
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def train(
        self,
        name: str,
        build: Callable[[], torch.nn.Module],
        loss_fn,
        flops_token: float,
        max_batch: int | None = None,
        compile: bool = False,
    ) -> Result:
        """Largest micro-batch from max_batch down (halving on OOM), then timed steps."""
        batch = max_batch or self.max_batch
        while batch >= 1:
            self._free()
            model = step = None
            try:
                with self.device:  # parameters are created (and initialised) on the device
                    model = build()
                if compile:  # each block, in place, as `sinklab fit --model.compile true` does
                    for block in getattr(model, "blocks", None) or model.model.layers:
                        block.compile()
                tokens = torch.randint(0, model.config.vocab_size, (batch, self.context + 1), device=self.device)
                step = train_step(model, tokens, self._autocast(loss_fn), lr=1e-4, fused=self.cuda)
                elapsed = self._seconds(step)
            except torch.cuda.OutOfMemoryError:
                batch //= 2
                continue
            finally:
                del model, step
            tokens_per_s = batch * self.context * self.steps / elapsed
            peak = torch.cuda.max_memory_allocated() if self.cuda else None
            return Result(name, batch, tokens_per_s, mfu(tokens_per_s, flops_token, self.peak), peak)
        raise RuntimeError(f"{name}: even micro-batch 1 does not fit at context {self.context}")

    def _seconds(self, step: Callable[[], object]) -> float:
        """Seconds of ``steps`` calls of ``step`` after ``warmup`` untimed ones."""
        runs = {
            name: lambda n=n: [step() for _ in range(n)] for name, n in [("warmup", self.warmup), ("timed", self.steps)]
        }
        return interleaved(runs, 1, sync=torch.cuda.synchronize if self.cuda else lambda: None)[0]["timed"][0]

    def _autocast(self, loss_fn: Callable) -> Callable:
        def loss(model, tokens):
            with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.cuda):
                return loss_fn(model, tokens)

        return loss

    def attention_only(self, name: str, fn: Callable, heads: int, head_dim: int, batch: int) -> Result:
        """Forward + backward of one attention layer's core (no projections); tokens/s and memory."""
        self._free()
        q, k, v = (
            torch.randn(batch, heads, self.context, head_dim, device=self.device, dtype=self.dtype, requires_grad=True)
            for _ in range(3)
        )
        try:
            elapsed = self._seconds(lambda: fn(q, k, v).float().square().mean().backward())
        except torch.cuda.OutOfMemoryError:
            return Result(name + " (OOM)", batch, 0.0, None, None)
        peak = torch.cuda.max_memory_allocated() if self.cuda else None
        return Result(name, batch, batch * self.context * self.steps / elapsed, None, peak)


def ours_loss(model, tokens):
    """The training module's loss (pipeline.train.loss): the head fused with the cross-entropy."""
    hidden = model(tokens[:, :-1], skip_head=True).final_hidden
    return linear_cross_entropy(hidden.flatten(0, 1), model.lm_head.weight, tokens[:, 1:].flatten())


def hf_loss(model, tokens):
    logits = model(input_ids=tokens[:, :-1], use_cache=False).logits  # no KV cache in training
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())


def preset(name: str, tiny: bool, context: int, **overrides) -> ModelConfig:
    shape = TINY_SHAPES[name] if tiny else {}
    return ModelConfig.from_preset(name, vocab_size=512 if tiny else 32000, max_seq_len=context, **shape, **overrides)


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--tiny", action="store_true", help="toy shapes (default on CPU)")
    parser.add_argument("--context", type=int, help="C (default 2048; 64 when tiny)")
    parser.add_argument("--steps", type=int, help="timed steps (default 30; 6 when tiny)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default 5; 3 when tiny)")
    parser.add_argument(
        "--max-batch",
        type=int,
        help="first micro-batch tried (default 64 for 60M, 16 for 1B; 4 when tiny)",
    )
    parser.add_argument("--skip-1b", action="store_true", help="only the 60M cases")
    parser.add_argument(
        "--compile", action="store_true", help="torch.compile each block of the softmax models, ours and HF's alike"
    )
    args = parser.parse_args(argv)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible")
    tiny = args.tiny or device.type == "cpu"
    pick = lambda given, full, small: given if given is not None else (small if tiny else full)
    context = pick(args.context, 2048, 64)
    bench = Bench(device, context, pick(args.steps, 30, 6), pick(args.warmup, 5, 3), pick(args.max_batch, 64, 4))
    first_batch = {"llama-60m": bench.max_batch, "llama-1b": pick(args.max_batch, 16, 4)}
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = "n/a" if bench.peak is None else f"{bench.peak / 1e12:.0f}TFLOP/s"
    print(
        f"device={gpu} peak_bf16={peak} dtype={str(bench.dtype).removeprefix('torch.')} C={context} "
        f"tiny={tiny} compile={args.compile} torch={torch.__version__}",
        flush=True,
    )

    ratios: dict[str, float] = {}
    for name in ["llama-60m"] + ([] if args.skip_1b else ["llama-1b"]):
        cfg = preset(name, tiny, context)
        flops = flops_per_token(cfg, context)
        ours = bench.train(
            f"sinklab {name}", lambda: Transformer(cfg), ours_loss, flops, first_batch[name], args.compile
        )
        print(ours.line(), flush=True)
        hf_llama = lambda: LlamaForCausalLM._from_config(hf_config(cfg), attn_implementation="sdpa")  # same shape
        hf = bench.train(f"hf-llama {name}", hf_llama, hf_loss, flops, first_batch[name], args.compile)
        print(hf.line(), flush=True)
        ratios[f"ours/hf {name}"] = ours.tokens_per_s / hf.tokens_per_s
        if name == "llama-60m":
            sig = preset(name, tiny, context, attention={"op": "sigmoid", "normalizer": "none"})
            sigmoid = bench.train(
                f"sinklab {name} sigmoid", lambda: Transformer(sig), ours_loss, flops_per_token(sig, context)
            )
            print(sigmoid.line(), flush=True)
            ratios[f"sigmoid/softmax {name}"] = sigmoid.tokens_per_s / ours.tokens_per_s
            attention_cases(bench, sig, ratios)

    for key, value in ratios.items():
        print(f"ratio {key} = {value:.3f}")
    print(f"ratio={ratios.get('ours/hf llama-1b', math.nan):.3f}")
    return 0


def attention_cases(bench: Bench, sig: ModelConfig, ratios: dict[str, float]) -> None:
    """One layer's attention core at the 60M shape: where the eager sigmoid op falls off."""
    H, dh, batch, spec = sig.n_heads, sig.head_dim, 1 if bench.cuda else 2, blocked_spec(sig)
    mask = torch.full((context := bench.context, context), float("-inf"), device=bench.device).triu(1)[None, None]
    cases = {
        "attn softmax sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "attn sigmoid eager": lambda q, k, v: (
            OPS["sigmoid"].fn(q, k, mask.to(q.dtype), sig.attention, None).weights.to(v.dtype) @ v
        ),
        "attn sigmoid torch tiles": lambda q, k, v: blocked_attention(q, k, v, spec, impl="torch"),
    }
    if triton_tiles.available() and (bench.cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        cases["attn sigmoid fused triton"] = lambda q, k, v: blocked_attention(q, k, v, spec, impl="triton")
    results = {name: bench.attention_only(name, fn, H, dh, batch) for name, fn in cases.items()}
    for result in results.values():
        print(result.line(), flush=True)
    soft = results["attn softmax sdpa"].tokens_per_s
    for name in results:
        if name != "attn softmax sdpa" and soft and results[name].tokens_per_s:
            ratios[f"{name.removeprefix('attn ')}/softmax attention"] = results[name].tokens_per_s / soft


if __name__ == "__main__":
    sys.exit(main())
