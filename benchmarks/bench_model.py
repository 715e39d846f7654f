"""Training-step throughput of SinkLab's model against HF LlamaForCausalLM, side by side.

Also grouped-query attention against the same shape with full heads, and each non-softmax attention op's
slow-down against softmax; the last line is ``ratio=<ours over HF>``.
"""

from __future__ import annotations

import statistics
import time

import torch
from side_by_side import arguments, interleaved, logits_loss, train_step

from pipeline.model import ModelConfig, Transformer
from pipeline.model.hf_native import to_hf
from pipeline.train.loss import next_token_loss

OPS = {
    "sigmoid (Z=1)": dict(op="sigmoid", normalizer="none"),
    "sigmoid (Z=sum)": dict(op="sigmoid", normalizer="sum"),
    "elu+1 (Z=1)": dict(op="elu1", normalizer="none"),
    "kernel identity (Z=max(|sum|,1))": dict(op="kernel", feature_map="identity", normalizer="abs_clamp"),
    "kernel elu+1 (Z=sum)": dict(op="kernel", feature_map="elu1", normalizer="sum"),
    "kernel mlp (Z=1)": dict(op="kernel", feature_map="mlp", normalizer="none"),
    "p-softmax (p=0.5)": dict(op="softmax", p=0.5),
    "clipped softmax": dict(op="clipped_softmax"),
}


ADAMW = {"lr": 1e-4, "weight_decay": 0.1}
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def compare(steps: dict, tokens: int, warmup: int, repeats: int, n_steps: int, clock) -> dict[str, float]:
    """Median tokens/s per entry."""
    interleaved(steps, warmup)
    runs = {name: lambda step=step: [step() for _ in range(n_steps)] for name, step in steps.items()}
    seconds, _ = interleaved(runs, repeats, clock)
    return {name: tokens * n_steps / statistics.median(s) for name, s in seconds.items()}


def main() -> None:
    parser = arguments(__doc__, preset="tiny", vocab=8192, batch=8, seq=256, warmup=3, repeats=5, steps=3)
    parser.add_argument(
        "--threads", type=int, default=1, help="the same for both models; 1 is steadiest on a shared machine"
    )
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    parser.add_argument("--kv-heads", type=int, help="key/value heads of the GQA comparison (default: heads / 2)")
    parser.add_argument("--skip-ops", action="store_true", help="only the HF and GQA comparisons")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    cfg = ModelConfig.from_preset(args.preset, vocab_size=args.vocab, max_seq_len=max(args.seq, 256))
    ours = Transformer(cfg).train()
    hf = to_hf(ours).train()
    hf.config._attn_implementation = "sdpa"
    idx = torch.randint(0, args.vocab, (args.batch, args.seq + 1))
    tokens = args.batch * args.seq
    print(
        f"preset={args.preset} d={cfg.d_model} L={cfg.n_layers} H={cfg.n_heads} ffn={cfg.d_ffn} "
        f"vocab={args.vocab} batch={args.batch}x{args.seq} threads={args.threads} clock={args.clock} "
        f"torch={torch.__version__}"
    )
    clock = CLOCKS[args.clock]

    twin = Transformer(cfg).train()
    twin.load_state_dict(ours.state_dict())
    alone = "sinklab, hf's loss"
    losses = {"sinklab": (ours, next_token_loss), alone: (twin, logits_loss), "hf-llama": (hf, logits_loss)}
    steps = {name: train_step(model, idx, loss, **ADAMW) for name, (model, loss) in losses.items()}
    speeds = compare(steps, tokens, args.warmup, args.repeats, args.steps, clock)
    for name, tps in speeds.items():
        print(f"{name:18s} {tps:10.0f} tokens/s (train step: fwd+bwd+AdamW)")
    print(f"ratio model alone (both with hf's loss) = {speeds[alone] / speeds['hf-llama']:.3f}")

    kv = args.kv_heads or max(1, cfg.n_heads // 2)
    torch.manual_seed(0)
    gqa = {
        "full heads": steps["sinklab"],
        "gqa": train_step(Transformer(cfg.replace(n_kv_heads=kv)), idx, next_token_loss, **ADAMW),
    }
    gqa_speeds = compare(gqa, tokens, 1, max(3, args.repeats - 2), args.steps, clock)
    print(
        f"grouped-query attention H={cfg.n_heads} KV={kv}: {gqa_speeds['gqa']:.0f} vs {gqa_speeds['full heads']:.0f} "
        f"tokens/s with full heads; gqa_ratio={gqa_speeds['gqa'] / gqa_speeds['full heads']:.3f} (> 1: faster)"
    )

    if not args.skip_ops:
        print("attention operations, training-step slow-down relative to softmax (SDPA):")
        op_steps = {"softmax": train_step(ours, idx, next_token_loss, **ADAMW)}
        for name, acfg in OPS.items():
            torch.manual_seed(0)
            op_steps[name] = train_step(Transformer(cfg.replace(attention=acfg)).train(), idx, next_token_loss, **ADAMW)
        op_speeds = compare(op_steps, tokens, 1, max(3, args.repeats - 2), args.steps, clock)
        for name, tps in op_speeds.items():
            print(f"  {name:34s} {tps:9.0f} tokens/s  slow-down x{op_speeds['softmax'] / tps:.2f}")

    print(f"ratio={speeds['sinklab'] / speeds['hf-llama']:.3f}")


if __name__ == "__main__":
    main()
