"""benchmarks/bench_gpu.py: the CPU smoke path end to end, and the micro-batch search."""

import re
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "bench_gpu.py"


def test_cpu_smoke_run_prints_every_case_and_the_ratio_last():
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--device",
        "cpu",
        "--context",
        "16",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--max-batch",
        "2",
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("device=cpu") and "tiny=True" in lines[0] and "C=16" in lines[0]
    cases = [re.match(r"case=(.*?)\s+micro_batch=", line).group(1) for line in lines if line.startswith("case=")]
    assert cases == [
        "sinklab llama-60m",
        "hf-llama llama-60m",
        "sinklab llama-60m sigmoid",
        "attn softmax sdpa",
        "attn sigmoid eager",
        "attn sigmoid torch tiles",
        "attn sigmoid fused triton",
        "sinklab llama-1b",
        "hf-llama llama-1b",
    ]  # the fused kernels under TRITON_INTERPRET=1
    assert all("mfu=   n/a" in line for line in lines if line.startswith("case="))  # no peak on a CPU
    ratio = float(lines[-1].removeprefix("ratio="))
    assert lines[-1].startswith("ratio=") and ratio > 0
    assert f"ratio ours/hf llama-1b = {ratio:.3f}" in done.stdout


def test_micro_batch_search_halves_on_out_of_memory(load_benchmark):
    bench_gpu = load_benchmark("bench_gpu")
    bench = bench_gpu.Bench(torch.device("cpu"), context=8, steps=1, warmup=0, max_batch=8)
    tried = []

    def loss_fn(model, tokens):
        tried.append(tokens.shape[0])
        if tokens.shape[0] > 2:
            raise torch.cuda.OutOfMemoryError("simulated")
        return bench_gpu.ours_loss(model, tokens)

    cfg = bench_gpu.preset("llama-60m", tiny=True, context=8)
    result = bench.train("x", lambda: bench_gpu.Transformer(cfg), loss_fn, 1.0)
    assert tried == [8, 4, 2] and result.batch == 2 and result.tokens_per_s > 0
