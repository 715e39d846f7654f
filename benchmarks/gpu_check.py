"""`make gpu-check`: every GPU path a user takes, run for real on one GPU, in one table.

Budget, limits, how a case is judged and the table: docs/gpu.md; `--device cpu` runs the harness on toy cases.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from gpu_check_cases import CONTEXT, DATA, Case, cpu_cases, gpu_cases  # noqa: E402
from gpu_check_plans import GRID_SECONDS, PLANS, dry_run, grid_cases, grid_lines, plan_cases  # noqa: E402
from gpu_check_report import Result, table  # noqa: E402

from pipeline import metric_names as N  # noqa: E402
from pipeline.train.compiling import BACKWARD_WITH_FORWARD  # noqa: E402
from pipeline.train.summary import health_problems, metric_rows  # noqa: E402

SINKLAB = [sys.executable, "-m", "pipeline.cli"]
PROFILER = "benchmarks.gpu_check_profile.StepProfile"
PLAN_BUDGET = 420  # a 15-minute window less the carry, the install and the start-up (docs/gpu.md)


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # else nothing of it is left
        os.killpg(proc.pid, signal.SIGKILL)  # started in a session of its own: its group is its pid
    proc.wait()


def first_error_line(log: str, code: int | None) -> str:
    """What went wrong, in one line: SinkLab's own refusal, else the last exception line, else the last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    ours = [line for line in lines if re.match(r"sinklab [\w-]+: (?!warning)", line)]
    raised = [line for line in lines if re.match(r"([\w.]+\.)?[A-Z]\w*(Error|Exception|Failed)\b", line)]
    line = ours[0] if ours else raised[-1] if raised else lines[-1] if lines else "no output"
    return f"exit {code}: {line}" if code else line


class Matrix:
    """Runs cases one after another under ``root`` (a run directory and a log per case)."""

    def __init__(
        self, cases: list[Case], root: Path, data: dict[str, Path], extra: list[str], timeout: float, profile=()
    ):
        self.cases = {c.name: c for c in cases}
        self.root, self.data, self.extra, self.timeout = root, data, extra, timeout
        self.deadline, self.proc, self.profile = float("inf"), None, set(profile)

    def run(self, case: Case, limit: float) -> Result:
        """The case, killed after ``limit`` seconds."""
        start = time.perf_counter()
        self.deadline = time.monotonic() + limit
        ours = not (self.root / case.name / "checkpoints").exists()  # never delete checkpoints it did not write
        log = self.root / f"{case.name}.log"
        try:
            problem = getattr(self, "_" + case.kind.replace("-", "_"))(case, log)
        except subprocess.TimeoutExpired:
            problem = f"killed at its time limit, {limit:.0f} s"
        finally:
            if self.proc is not None:
                kill_group(self.proc)  # also on Ctrl-C or SIGTERM, wherever they came
        result = Result(case.name, problem, time.perf_counter() - start)
        if case.kind in ("fit", "preempt"):
            self._speed(result, self.root / case.name / "metrics.jsonl")
            text = log.read_text(errors="replace") if log.exists() else ""
            flags = dict(zip(case.args, case.args[1:]))
            recipe = yaml.safe_load((REPO / flags["--config"]).read_text()) if "--config" in flags else {}
            compiled = flags.get("--model.compile", str(bool((recipe.get("model") or {}).get("compile"))).lower())
            result.mode = "eager" if compiled != "true" else "compiled"
            result.mode = "eager (compile failed)" if "torch.compile failed" in text else result.mode
            result.mode += ", resumed" if "Restored all states" in text else ""
            if ours and not any(c.reads == case.name for c in self.cases.values()):  # a 1B one takes ~17 GB
                shutil.rmtree(self.root / case.name / "checkpoints", ignore_errors=True)
        return result

    def _run(self, command: list[str], log: Path, wait: bool = True):
        env = dict(os.environ, SINKLAB_REPORT_TILES="1")  # the autotuned tiles' choice, into the log
        with open(log, "a") as out:
            self.proc = subprocess.Popen(
                command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self._wait(self.proc) if wait else self.proc

    def _wait(self, proc: subprocess.Popen) -> int:
        """Its exit status; at the deadline (or on Ctrl-C) its whole process group is killed."""
        try:
            return proc.wait(timeout=max(self.deadline - time.monotonic(), 0))
        finally:
            kill_group(proc)  # also what it left running (a launcher's ranks)

    def _fit_command(self, case: Case) -> list[str]:
        data, run_dir = str(self.data[case.data]), str(self.root / case.name)
        command = [*SINKLAB, "fit", *case.args, "--data.path", data, "--run-dir", run_dir, "--resume", "auto"]
        if case.name in self.profile:
            profiler = {"class_path": PROFILER, "init_args": {"dirpath": str(self.root / f"{case.name}-profile")}}
            command.append("--trainer.callbacks+=" + json.dumps(profiler))
        return command + self.extra

    def notes(self, case: Case) -> list[str]:
        """What the case's log says of the tuned tiles, and its profile's summary."""
        log, summary = self.root / f"{case.name}.log", self.root / f"{case.name}-profile" / "summary.txt"
        text = log.read_text(errors="replace") if log.exists() else ""
        lines = sorted({line for line in text.splitlines() if line.startswith("sinklab tiles: ")})
        if case.name in self.profile:
            lines += summary.read_text().splitlines() if summary.exists() else ["profile: no summary written"]
        return [f"    {line}" for line in lines]

    def _fit(self, case: Case, log: Path) -> str | None:
        code = self._run(self._fit_command(case), log)
        if code != 0:
            return first_error_line(log.read_text(errors="replace"), code)
        final = self._final_checkpoint(case)
        if not final.exists():
            return f"no final checkpoint {final.name}"
        problems = health_problems(self.root / case.name / "metrics.jsonl", case.steps, case.log_every)
        return problems[0] if problems else None

    def _final_checkpoint(self, case: Case) -> Path:
        return self.root / case.name / "checkpoints" / f"step-{case.steps:06d}.ckpt"

    def _preempt(self, case: Case, log: Path) -> str | None:
        """A SLURM job told to stop: SIGUSR1 once a third of the steps are logged, then --resume auto to the end."""
        metrics = self.root / case.name / "metrics.jsonl"
        proc = self._run(self._fit_command(case), log, wait=False)
        while (
            proc.poll() is None
            and time.monotonic() < self.deadline
            and not any(step >= case.steps // 3 for step, _ in metric_rows(metrics, N.TRAIN_LOSS))
        ):
            time.sleep(0.05)
        if proc.poll() is None:
            proc.send_signal(signal.SIGUSR1)
        code = self._wait(proc)
        if code != 0:
            return "first start: " + first_error_line(log.read_text(errors="replace"), code)
        if "stopped by SIGUSR1" not in log.read_text(errors="replace"):
            return "the first start ran to the end: SIGUSR1 came too late to test the resume"
        return self._fit(case, log)

    def _analyze(self, case: Case, log: Path) -> str | None:
        """``sinklab analyze`` or ``stream-ppl`` (the case's kind) of the checkpoint the case reads."""
        out = self.root / (case.name if case.kind == "analyze" else f"{case.name}.json")
        output = out / "measures.json" if case.kind == "analyze" else out
        source, data = self._final_checkpoint(self.cases[case.reads]), self.data[case.data]
        command = [*SINKLAB, case.kind, str(source), "--dataset", str(data), "--out", str(out), *case.args]
        code = self._run(command, log)
        if code != 0:
            return first_error_line(log.read_text(errors="replace"), code)
        return None if output.exists() else f"wrote no {output.name}"

    _stream_ppl = _analyze

    def _command(self, case: Case, log: Path) -> str | None:
        code = self._run([sys.executable, *case.args], log)
        return first_error_line(log.read_text(errors="replace"), code) if code else None

    def _pytest(self, case: Case, log: Path) -> str | None:
        code = self._run([sys.executable, "-m", "pytest", *case.args], log)
        text = log.read_text(errors="replace")
        if code:
            return first_error_line(text, code)
        skipped = [line for line in text.splitlines() if line.startswith("SKIPPED")]
        return skipped[0] if skipped else None if re.search(r"\d+ passed", text) else "no test ran"

    @staticmethod
    def _speed(result: Result, metrics: Path) -> None:
        def typical(key: str) -> float | None:
            values = [row[1] for row in metric_rows(metrics, key)]
            values = values[1:] if len(values) > 1 else values  # the first window holds compilation
            return statistics.median(values) if values else None

        result.tokens_per_s, result.mfu = typical(N.TOKENS_PER_S), typical(N.MFU)
        result.peak_gib = max((row[1] for row in metric_rows(metrics, N.MAX_MEMORY_GIB)), default=None)


def run_within(matrix: Matrix, cases: list[Case], budget: float, start: float, results: list[Result]) -> None:
    """The cases in order, each started only while its ``minimum`` is left of ``budget`` seconds from ``start``."""
    for case in cases:
        left = budget - (time.monotonic() - start)
        needs = matrix.cases.get(case.reads)
        done = {r.case: r for r in results}
        if left < max(case.minimum, 1):
            results.append(Result(case.name, None, 0, skipped=f"{left:.0f} s left, needs {case.minimum:.0f} s"))
        elif needs and (needs.name not in done or done[needs.name].problem or done[needs.name].skipped):
            results.append(Result(case.name, None, 0, skipped=f"reads {needs.name}'s checkpoint"))
        else:
            begun = time.monotonic()
            try:
                results.append(matrix.run(case, min(case.limit or matrix.timeout, left)))
            except KeyboardInterrupt:  # its process group is killed by then
                results.append(Result(case.name, "interrupted (SIGTERM or Ctrl-C)", time.monotonic() - begun))
                raise
        r = results[-1]
        verdict = f"skipped ({r.skipped})" if r.skipped else "ok" if r.problem is None else "FAIL " + r.problem
        print(f"  {case.name}: {verdict} ({r.seconds:.0f} s)", flush=True)
        notes = [] if r.skipped else matrix.notes(case)
        if notes:
            print("\n".join(notes), flush=True)


def prepare(key: str, path: Path, seconds: float) -> None:
    if not (path / "manifest.json").exists():
        subprocess.run(
            [*SINKLAB, "prep", "embedded", "--out", str(path), "--context-length", str(CONTEXT[key]), "--no-progress"],
            cwd=REPO,
            check=True,
            timeout=max(seconds, 1),
        )


def names_of(text: str | None) -> list[str]:
    return [name.strip() for name in (text or "").split(",") if name.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--cases", help="comma list of case names (default: all of the device's)")
    parser.add_argument("--plan", choices=sorted(PLANS), help="a GPU window's cases in order, with the 1B grid")
    parser.add_argument("--dry-run", action="store_true", help="(with --plan) list its cases and minimums; run none")
    parser.add_argument("--profile", help="comma list of cases to profile over their last steps (torch.profiler)")
    parser.add_argument(
        "--data",
        type=Path,
        help="(cpu) a prepared dataset for every case (default: the embedded corpus at C = 64, prepared once)",
    )
    parser.add_argument("--extra-args", default="", help="appended to every `sinklab fit` (quoted, as one string)")
    parser.add_argument("--root", type=Path, help="where runs and logs go (default runs/gpu-check/<time>)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per command (where a case gives none)")
    parser.add_argument(
        "--budget", type=float, help="seconds for everything, data preparation too (default 480; a plan's 420)"
    )
    args = parser.parse_args(argv)
    args.budget = args.budget or (PLAN_BUDGET if args.plan else 480)
    start = time.monotonic()
    if args.dry_run and not args.plan:
        parser.error("--dry-run: lists a plan's cases; give --plan (" + ", ".join(sorted(PLANS)) + ")")
    if args.plan and (args.cases or args.device == "cpu"):
        parser.error(f"--plan {args.plan}: runs its own cases on a GPU; drop --cases and --device cpu")
    if args.dry_run:
        print(dry_run(args.plan, args.budget))
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu-check: needs a CUDA GPU (torch.cuda.is_available() is False); `--device cpu` runs the harness "
            "on toy cases",
            file=sys.stderr,
        )
        return 2
    data = dict(DATA, cpu=args.data) if args.data else dict(DATA)
    every = gpu_cases() + grid_cases() if args.device == "cuda" else cpu_cases()  # a refusal prepares nothing
    names = [c.name for c in every]
    groups = plan_cases(args.plan)[:3] if args.plan else None
    wanted = [c.name for group in groups for c in group] if groups else names_of(args.cases) or names
    profile = names_of(args.profile) + list(plan_cases(args.plan)[3].profile if args.plan else ())
    for option, asked in (("--cases", wanted), ("--profile", profile)):
        if unknown := [n for n in asked if n not in names]:
            parser.error(f"{option}: unknown {', '.join(unknown)}; the {args.device} cases are {', '.join(names)}")
    if missing := [c.reads for c in every if c.name in wanted and c.reads and c.reads not in wanted]:
        parser.error(f"--cases: {', '.join(missing)} must run too (the analysis cases read its checkpoint)")
    if args.device == "cpu":
        prepare("cpu", data["cpu"], args.budget)
        every = cpu_cases(json.loads((data["cpu"] / "manifest.json").read_text())["context_length"])
    cases = [c for c in every if c.name in wanted]
    if groups:  # the plan's own order and minimums (a profiled case's raised)
        every, cases = every + [c for group in groups for c in group], [c for group in groups for c in group]
    for key in sorted({c.data for c in cases}):
        prepare(key, data[key], args.budget - (time.monotonic() - start))
    root = args.root or REPO / "runs" / "gpu-check" / time.strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    versions = f"torch {torch.__version__}, triton {getattr(sys.modules.get('triton'), '__version__', '-')}"
    versions += f", backward compiled {'with the forward' if BACKWARD_WITH_FORWARD else 'by a zero-gradient pass'}"
    print(f"gpu-check: {len(cases)} cases on {device}; {versions}; {args.budget:.0f} s; logs in {root}", flush=True)
    matrix, results = Matrix(every, root, data, shlex.split(args.extra_args), args.timeout, profile), []
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a job's end: the table is still printed
    before, cells, after = groups or ([], [], cases)
    try:
        run_within(matrix, before, args.budget, start, results)
        left = args.budget - (time.monotonic() - start)
        run_within(matrix, cells, min(GRID_SECONDS, left), time.monotonic(), results)
        run_within(matrix, after, args.budget, start, results)
    except KeyboardInterrupt:
        print("gpu-check: interrupted; the table of what ran", flush=True)
    finally:
        (root / "results.json").write_text(json.dumps([vars(r) for r in results], indent=1))
        print(table(results), flush=True)
        for line in grid_lines(results):
            print(line, flush=True)
    return 1 if any(r.problem for r in results) or len(results) < len(cases) else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
