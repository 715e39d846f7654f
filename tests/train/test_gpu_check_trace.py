"""benchmarks/gpu_check_trace.py's reading of a trace with device kernels (written here as torch.profiler
writes a CUDA one): kernels ranked, each charged to the phase that launched it, idle gaps, and the
trace's size limit. The callback itself runs in tests/train/test_gpu_check.py (CPU activities)."""

from __future__ import annotations

import gzip
import json


def span(name: str, cat: str, ts: float, dur: float, **args) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": 1, "args": args}


def kernel(name: str, launched: float, ts: float, dur: float, correlation: int) -> list[dict]:
    launch = span("cudaLaunchKernel", "cuda_runtime", launched, 1, correlation=correlation)
    return [launch, span(name, "kernel", ts, dur, correlation=correlation) | {"pid": 0, "tid": 7}]


def two_steps() -> dict:
    """Two steps of 1000 us: forward 0-400, backward 400-800 (ZeRO hook 600-700), optimizer 800-900, data."""
    events = []
    for step, t0 in enumerate((0, 1000)):
        events += [
            span("sinklab::forward", "user_annotation", t0, 400),
            span("sinklab::backward", "user_annotation", t0 + 400, 400),
            span("deepspeed::reduce_ipg_grads", "user_annotation", t0 + 600, 100),
            span("deepspeed::average_tensor", "user_annotation", t0 + 610, 50),  # nested: counted once
            span("sinklab::optimizer", "user_annotation", t0 + 800, 100),
            span("sinklab::data", "user_annotation", t0 + 900, 100),
        ]
        c = 10 * step
        events += kernel("ampere_bf16_gemm", t0 + 10, t0 + 20, 300, c + 1)
        events += kernel("ampere_bf16_gemm", t0 + 410, t0 + 420, 150, c + 2)
        events += kernel("ncclDevKernel_AllReduce_Sum_bf16", t0 + 620, t0 + 630, 50, c + 3)
        events += kernel("multi_tensor_apply_kernel<AdamW>", t0 + 810, t0 + 820, 60, c + 4)
    return {"traceEvents": events, "sinklabProfiledSteps": 2}


def test_kernels_are_charged_to_the_phase_that_launched_them(load_benchmark):
    profile = load_benchmark("gpu_check_trace")
    text = profile.summarize(two_steps())
    lines = text.splitlines()
    assert lines[0] == "profiled optimizer steps: 2"
    assert lines[1] == "top 15 kernels by device time (0.56 ms a step in all):"
    assert lines[2].split()[:5] == ["0.450", "ms/step", "80.4%", "4x", "ampere_bf16_gemm"]
    assert "  forward: 0.400 ms wall, 0.300 ms device" in text
    assert "  backward: 0.400 ms wall, 0.200 ms device" in text
    assert "  optimizer: 0.100 ms wall, 0.060 ms device" in text
    assert "  data and between steps: 0.100 ms wall, 0.000 ms device" in text
    assert "  DeepSpeed gradient hooks and reduction: 0.100 ms wall, 0.050 ms device" in text
    assert "  collective (NCCL) kernels: 0.050 ms device" in text
    assert "  device idle gaps: 0.440 ms of 1.000" in text


def test_a_trace_without_phases_says_so(load_benchmark):
    profile = load_benchmark("gpu_check_trace")
    text = profile.summarize({"traceEvents": [span("aten::mm", "cpu_op", 0, 10)]})
    assert "no device kernels in the trace (CPU activities only)" in text
    assert "  forward: none in the trace" in text and "device idle gaps: none measurable" in text


def test_an_oversized_trace_keeps_its_device_events_and_marks(tmp_path, load_benchmark):
    profile = load_benchmark("gpu_check_trace")
    trace = two_steps()
    trace["traceEvents"] += [span(f"aten::op{i}", "cpu_op", i, 1) for i in range(3000)]
    path = tmp_path / "trace.json.gz"
    limit = len(gzip.compress(json.dumps(trace).encode())) - 1
    note = profile.write_trace(trace, path, limit=limit)
    assert note == "trace: over 0 MiB compressed; kept its device events and phase marks only"
    kept = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    assert {e["cat"] for e in kept} == {"kernel", "user_annotation"}
    assert profile.write_trace(trace, tmp_path / "none.json.gz", limit=10).startswith("trace: not written")
    assert not (tmp_path / "none.json.gz").exists()
