"""benchmarks/gpu_check.py, the matrix `make gpu-check` runs on a GPU, driven on toy CPU cases:
its table, its verdicts and its exit status. It starts real `sinklab fit` processes (one stopped
by SIGUSR1 and resumed, one refused), hence ~45 s in all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fit_runs import REPO, built_fit, paths

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
    rows = lines[start + 2 : next(i for i, line in enumerate(lines) if " cases ok; " in line)]
    return {line.split()[0]: line.split() for line in rows}


def test_a_preempted_run_resumes_and_passes_with_its_speed_and_its_profile(tiny_ds, tmp_path):
    """The profile of the resumed start's last 3 steps: printed after the case, the trace beside it."""
    done = gpu_check(["--data", str(tiny_ds), "--cases", "preempt", "--profile", "preempt"], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = table_rows(done.stdout)["preempt"]
    assert row[1] == "ok" and float(row[2].replace(",", "")) > 0  # tokens/s
    assert done.stdout.splitlines()[-1].startswith("1 of 1 cases ok; ")
    log = (tmp_path / "check" / "preempt.log").read_text()
    assert "stopped by SIGUSR1 at step" in log and "Restored all states from the checkpoint" in log
    summary = done.stdout[done.stdout.index("  preempt: ok") : done.stdout.index("case ")]
    assert "profiled optimizer steps: 3" in summary and "top 15 CPU ops by self time:" in summary
    assert "aten::mm" in summary and "DeepSpeed gradient hooks and reduction: none in the trace" in summary
    for phase in ("forward", "backward", "optimizer", "data and between steps"):
        assert f"      {phase}: " in summary and f"{phase}: none" not in summary
    trace = tmp_path / "check" / "preempt-profile" / "trace.json.gz"
    assert 0 < trace.stat().st_size <= 20 * 2**20


def test_a_failing_case_gives_its_first_error_line_and_exit_1(tiny_ds, tmp_path):
    done = gpu_check(["--data", str(tiny_ds), "--cases", "softmax", "--extra-args", "--optim.lr -1"], tmp_path)
    assert done.returncode == 1
    assert "softmax: exit 2: sinklab fit: optim.lr=-1.0: must be positive" in done.stdout
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
    cases, cells = gpu_check.gpu_cases(), gpu_check.grid_cases()
    fits = [c for c in cases if c.kind in ("fit", "preempt")]
    assert {c.reads for c in cases if c.reads} <= {c.name for c in fits}
    assert len({c.name for c in cases + cells}) == len(cases + cells)
    shipped = next(c for c in cases if c.name == "60m-shipped")
    assert "--trainer.strategy.init_args.config" not in shipped.args  # the recipe's own strategy
    picked = [next(c for c in cells if c.name == name) for name in ("1b-mb8-z1", "1b-mb16-ac-z2")]
    for case in fits + picked:
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
            if case in picked:
                assert cli.model.activation_checkpointing == ("-ac-" in case.name)
                assert cli.trainer.strategy.config["zero_optimization"]["stage"] == int(case.name[-1])
    for case in (c for c in cases if c.kind in ("pytest", "command")):
        assert (REPO / case.args[0]).is_file()  # the test file or the script


FAKE_SINKLAB = """
import subprocess, sys, time
name = sys.argv[sys.argv.index("--run.name") + 1]
if name == "hangs":  # a launcher whose rank hangs: both must go
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    open(sys.argv[-1], "w").write(str(child.pid))
    time.sleep(60)
"""


def test_cases_start_within_the_budget_and_a_hung_one_is_killed_with_its_children(tmp_path, load_benchmark):
    """The planning and the time limits, with a stand-in for `sinklab fit` (a script that ends
    at once, or starts a child and hangs): fast, no training."""
    import time

    gpu_check = load_benchmark("gpu_check")
    fake = tmp_path / "fake_sinklab.py"
    fake.write_text(FAKE_SINKLAB)
    gpu_check.SINKLAB = [sys.executable, str(fake)]
    child_pid = tmp_path / "child.pid"

    def case(name: str, minimum: float, limit: float):
        return gpu_check.Case(name, "fit", ("--run.name", name), steps=2, minimum=minimum, limit=limit)

    cases = [case("quick", 0, 30), case("hangs", 0, 1.5), case("too-long", 60, 300), case("last", 0, 30)]
    matrix = gpu_check.Matrix(cases, tmp_path, {"c2048": tmp_path}, [str(child_pid)], timeout=30)
    results, start = [], time.monotonic()
    gpu_check.run_within(matrix, cases, 30, start, results)
    assert time.monotonic() - start < 15
    verdicts = {r.case: (r.problem, r.skipped) for r in results}
    assert [r.case for r in results] == ["quick", "hangs", "too-long", "last"]
    assert verdicts["quick"][0].startswith("no final checkpoint")  # it ran to its end and was judged
    assert verdicts["hangs"] == ("killed at its time limit, 2 s", None)
    assert verdicts["too-long"][1].endswith("s left, needs 60 s") and verdicts["last"][0] is not None
    pid = int(child_pid.read_text())
    for _ in range(50):  # the orphaned child is reaped by init
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the hung case's child {pid} survived")


def test_the_table_gives_every_case_and_the_goal_ratios_also_of_a_killed_case(load_benchmark):
    gpu_check = load_benchmark("gpu_check")
    R = gpu_check.Result
    results = [
        R("60m-shipped", None, 70, tokens_per_s=950_000, mfu=0.31, peak_gib=30.2, mode="compiled"),
        R("60m-compiled", None, 65, tokens_per_s=1_000_000, mfu=0.33, peak_gib=28.0, mode="compiled"),
        R("small-softmax", None, 50, tokens_per_s=400_000, mode="compiled"),
        R("small-sigmoid", "killed at its time limit, 120 s", 120, tokens_per_s=300_000, mode="compiled"),
        R("preempt", None, 95, tokens_per_s=900_000, mode="compiled, resumed"),
        R("small-sink-logit", None, 0, skipped="40 s left, needs 45 s"),
    ]
    text = gpu_check.table(results)
    rows = table_rows(text)
    assert rows["small-sigmoid"][1:3] == ["FAIL", "killed"] and "300,000" in rows["small-sigmoid"]
    assert rows["preempt"][-4:] == ["compiled,", "resumed", "95", "s"]
    assert rows["small-sink-logit"][1:3] == ["skipped:", "40"]
    assert "\n5 of 5 cases ok; " not in text and "\n4 of 5 cases ok; 1 skipped; " in text
    assert "60m as shipped / compiled without DeepSpeed: 0.95 (goal >= 0.95: met)" in text
    assert "sigmoid (Triton tiles) / softmax: 0.75 (goal >= 0.8: MISSED)" in text
    assert "sink logit / softmax: - (goal >= 0.95; small-sink-logit and small-softmax give no figure)" in text
    assert "1B MFU" not in text  # not asked for
    ones = [R("1b-shipped", None, 80, mfu=0.44), R("1b-mb32-z1", None, 60, mfu=0.52), R("1b-mb8-z1", "x", 9, mfu=0.6)]
    assert "1B MFU (1b-mb32-z1): 0.52 (goal >= 0.55: MISSED)" in gpu_check.table(ones)


def test_a_terminated_check_kills_its_case_and_still_prints_the_table(tiny_ds, tmp_path):
    """SIGTERM (a job's end) while a fit runs: the fit's process group goes, the table comes."""
    import signal
    import time

    env = dict(os.environ, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/mlflow.db")
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--device", "cpu", "--root", str(tmp_path / "check")]
    proc = subprocess.Popen(
        [*command, "--data", str(tiny_ds), "--cases", "preempt"], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().startswith("gpu-check: 1 cases on cpu; torch ")
    log = tmp_path / "check" / "preempt.log"
    for _ in range(300):  # until the fit has started
        if log.exists() and log.stat().st_size:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out = proc.stdout.read()
    assert proc.wait(timeout=60) == 1
    assert "interrupted; the table of what ran" in out
    assert table_rows(out)["preempt"][1:3] == ["FAIL", "interrupted"] and "\n0 of 1 cases ok; 0 skipped; " in out
    for _ in range(50):  # the fit (its run directory is under tmp_path) is gone
        if not processes_naming(str(tmp_path)):
            break
        time.sleep(0.1)
    assert not processes_naming(str(tmp_path))


def processes_naming(text: str) -> list[int]:
    """Live processes whose command line holds ``text`` (zombies left out)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text in cmdline and state != "Z":
            found.append(int(proc.name))
    return found
