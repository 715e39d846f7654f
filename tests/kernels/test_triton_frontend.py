"""The fused Triton kernels as torch.compile hands them to Triton's compiler.

Inductor compiles a user kernel with the argument types it infers, and a Python float may
arrive typed fp64 (an H100 run: `Loop-carried variable row_sum has initial type fp32 but is
re-assigned to fp64`). Triton's front end (Python AST to TTIR, where that error is raised) needs
no GPU, so this builds each kernel's TTIR for the CUDA target from the arguments
``FusedTiles`` launches it with, every runtime float typed fp64 and every int i64 (the widest
Inductor gives), and checks that it compiles and that, for bf16 and fp32 inputs, no value in it
is fp64. It runs in a subprocess: under TRITON_INTERPRET=1 (tests/conftest.py) ``triton.jit``
gives interpreted functions, which have no front end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")


def test_kernels_compile_with_the_widest_scalar_types_and_keep_fp64_out():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(results) == 3 * 3 * 3 * 2 * 2 and all(r["problem"] is None for r in results), [
        r for r in results if r["problem"]
    ][:5]


def _cases():
    """Every kernel x similarity x mask x positional bias x input dtype."""
    import torch

    from pipeline.kernels import triton_kernels as tk
    from pipeline.kernels import triton_tiles as tt
    from pipeline.kernels.tiled import MaskSpec, TileSpec

    B, H, T, D = 1, 2, 16, 64
    for dtype in (torch.bfloat16, torch.float32):
        acc = tt.accumulator(torch.empty(0, dtype=dtype))
        q = k = v = torch.empty(B, H, T, D, dtype=dtype)
        rows, rows_acc, row_sum = (
            torch.empty(B, H, T, D, dtype=dtype),
            torch.empty(B, H, T, D, dtype=acc),
            torch.empty(B, H, T, dtype=acc),
        )
        for bias in (None, torch.empty(1, H, T, T, dtype=torch.float32)):
            for similarity in tt.SIMILARITIES:
                for mask in ("causal", "prefix", "sliding"):
                    spec = TileSpec(
                        similarity=similarity, score_factor=D**-0.5, mask=MaskSpec(mask, window=4, prefix=3)
                    )
                    scalars, meta = tt._launch_args(q, k, v, bias, spec)
                    meta = dict(meta, BLOCK_M=64, BLOCK_N=64)
                    pointers = {
                        tk.forward: (q, k, v, bias, rows_acc, row_sum),
                        tk.backward_kv: (q, k, v, bias, rows_acc, row_sum, rows, rows),
                        tk.backward_q: (q, k, v, bias, rows_acc, row_sum, rows),
                    }
                    for kernel, tensors in pointers.items():
                        yield (
                            f"{kernel.fn.__name__} {similarity} {mask} bias={bias is not None} {dtype}",
                            kernel,
                            [*tensors, *scalars],
                            meta,
                            dtype,
                        )


def _signature(kernel, args, meta):
    """What Inductor may declare: tensors by dtype, floats fp64, ints i64; None and meta constexpr."""
    from triton.runtime.jit import mangle_type

    signature, constexprs = {}, dict(meta)
    for name, arg in zip(kernel.arg_names, args):
        if arg is None:
            signature[name], constexprs[name] = "constexpr", None
        elif isinstance(arg, bool) or not isinstance(arg, (int, float)):
            signature[name] = mangle_type(arg)
        else:
            signature[name] = "fp64" if isinstance(arg, float) else "i64"
    signature.update({name: "constexpr" for name in meta})
    return signature, constexprs


def main() -> None:
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    options = backend.parse_options({})
    results = []
    for name, kernel, args, meta, _dtype in _cases():
        signature, constexprs = _signature(kernel, args, meta)
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        try:
            ttir = str(
                ASTSource(kernel, signature, constexprs=constexprs).make_ir(
                    target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context
                )
            )
            problem = "fp64 values in the TTIR" if "f64" in ttir else None
        except Exception as exc:  # the compiler's error, reported by case
            problem = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]}"
        results.append({"case": name, "problem": problem})
    print(json.dumps(results))


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    main()
