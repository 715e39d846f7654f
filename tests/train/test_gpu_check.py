"""benchmarks/gpu_check.py, the matrix `make gpu-check` runs on a GPU, driven on toy CPU cases:
its table, its verdicts and its exit status. It starts real `sinklab fit` processes (one stopped
by SIGUSR1 and resumed, one refused), hence ~45 s in all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO, built_fit, paths

SCRIPT = REPO / "benchmarks" / "gpu_check.py"


def gpu_check(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/mlflow.db")
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--root", str(tmp_path / "check"), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def table_rows(stdout: str) -> dict[str, list[str]]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("case "))
    return {line.split()[0]: line.split() for line in lines[start + 2 :] if " cases ok; " not in line}


def test_a_preempted_run_resumes_and_passes_with_its_speed(tiny_ds, tmp_path):
    done = gpu_check(["--data", str(tiny_ds), "--cases", "preempt"], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = table_rows(done.stdout)["preempt"]
    assert row[1] == "ok" and float(row[2].replace(",", "")) > 0  # tokens/s
    assert done.stdout.splitlines()[-1].startswith("1 of 1 cases ok; ")
    log = (tmp_path / "check" / "preempt.log").read_text()
    assert "stopped by SIGUSR1 at step" in log and "Restored all states from the checkpoint" in log


def test_a_failing_case_gives_its_first_error_line_and_exit_1(tiny_ds, tmp_path):
    done = gpu_check(["--data", str(tiny_ds), "--cases", "softmax", "--extra-args", "--model.optim.lr -1"], tmp_path)
    assert done.returncode == 1
    assert "softmax: exit 2: sinklab fit: model.optim.lr=-1.0: must be positive" in done.stdout
    assert table_rows(done.stdout)["softmax"][1] == "FAIL"
    assert "\n0 of 1 cases ok; " in done.stdout


def test_the_first_error_line_is_ours_else_the_exception_of_the_last_traceback(load_benchmark):
    first_error_line = load_benchmark("gpu_check").first_error_line
    traceback = (
        'Traceback (most recent call last):\n  File "x.py", line 1\n'
        "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:\n"
        "sinklab fit: warning: torch.compile failed (...)\n"
        'Traceback (most recent call last):\n  File "y.py", line 2\n'
        "RuntimeError: The current optimizer, AdamW, does not allow for gradient clipping\n"
    )
    assert first_error_line(traceback, 1) == (
        "exit 1: RuntimeError: The current optimizer, AdamW, does not allow for gradient clipping"
    )
    assert (
        first_error_line("loading\nsinklab fit: data.path=x: no manifest.json there\n", 2)
        == "exit 2: sinklab fit: data.path=x: no manifest.json there"
    )
    assert first_error_line("", -9) == "exit -9: no output"


def test_an_unknown_case_is_refused_with_the_list(tmp_path):
    done = gpu_check(["--cases", "softmax,nope", "--data", str(tmp_path / "data")], tmp_path)
    assert done.returncode == 2 and "--cases: unknown nope; the cpu cases are softmax, sigmoid" in done.stderr
    assert not (tmp_path / "data").exists()  # refused before the corpus is prepared


def test_every_gpu_case_is_a_valid_sinklab_command(tiny_ds, tmp_path, monkeypatch, load_benchmark):
    """The GPU matrix cannot run here; its arguments are parsed and its classes built as
    `sinklab fit` would (on the CPU accelerator), so a typo fails now and not on a lent GPU."""
    gpu_check = load_benchmark("gpu_check")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.chdir(REPO)
    cases = gpu_check.gpu_cases()
    fits = [c for c in cases if c.kind in ("fit", "preempt")]
    assert {c.reads for c in cases if c.reads} <= {c.name for c in fits}
    for case in fits:
        args = [
            *case.args,
            *paths(tiny_ds, tmp_path / case.name),
            "--trainer.accelerator",
            "cpu",
            "--arch.max_seq_len",
            "64",
        ]
        with built_fit(args) as cli:
            assert cli.trainer.max_steps == case.steps and cli.trainer.log_every_n_steps == case.log_every
