"""`make gpu-check`: every GPU path a user takes, run for real on one GPU, in one table.

    python benchmarks/gpu_check.py                      # the matrix below, on CUDA (under 9 minutes on an H100)
    python benchmarks/gpu_check.py --cases 60m-zero2,preempt
    python benchmarks/gpu_check.py --device cpu         # the harness on toy cases (tests run it so)

The GPU matrix: paper-60m.yaml as shipped (DeepSpeed ZeRO-2, bf16, compiled) and without
compile, on one device without DeepSpeed (the reference of the 0.95x speed goal), under ZeRO-1,
ZeRO-3 and FSDP2; gpu-small.yaml (C = 512, the gpu scale of the paper studies) with softmax,
sigmoid without normalisation (the fused Triton tiles), the elu+1 kernel and softpick; the 1B
shape (TinyLlama's) under ZeRO-2, compiled; a run stopped by SIGUSR1 a third of the way (a
checkpoint at the next step boundary) and resumed with --resume auto; `sinklab analyze` and `sinklab stream-ppl` on CUDA of
a checkpoint the matrix wrote. Data: the embedded corpus packed at C = 2048 and 512 (prepared
once, seconds).

Each case is judged by what a user would check: exit status, the final checkpoint, train/loss
finite and present at every step it is due (trainer.log_every_n_steps, pipeline.train.summary
.health_problems), the analysis outputs. tokens/s and MFU are the run's perf/* metrics (median
of its windows after the first, which holds compilation), peak memory its perf/max_memory_gib.
The table ends the output; the exit status is 1 if any case failed, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline import metric_names as N  # noqa: E402
from pipeline.train.summary import health_problems, metric_rows  # noqa: E402

SINKLAB = [sys.executable, "-m", "pipeline.cli"]
DATA = {
    "c2048": REPO / "data" / "embedded-c2048",
    "c512": REPO / "data" / "embedded-c512",
    "cpu": REPO / "data" / "embedded-c64",
}
CONTEXT = {"c2048": 2048, "c512": 512, "cpu": 64}


@dataclass(frozen=True)
class Case:
    """kind: fit, preempt (SIGUSR1 a third of the way, then --resume auto),
    analyze or stream-ppl (of the final checkpoint of case ``reads``). args: the command's own
    (for fits: recipe, data and overrides). log_every: the recipe's trainer.log_every_n_steps."""

    name: str
    kind: str
    args: tuple[str, ...]
    steps: int = 0
    data: str = "c2048"
    log_every: int = 10
    reads: str = ""


def fit_case(
    name: str,
    recipe: str,
    data: str,
    steps: int,
    *overrides: str,
    kind: str = "fit",
    log_every: int = 10,
    window: int = 10,
) -> Case:
    common = (
        "--config",
        f"configs/recipes/{recipe}.yaml",
        "--trainer.max_steps",
        str(steps),
        "--trainer.log_every_n_steps",
        str(log_every),
        "--run.experiment",
        "gpu-check",
        "--run.name",
        name,
        "--run.log_model",
        "false",
        "--run.system_metrics",
        "false",
        "--run.sink_every",
        "0",
        "--run.val_every",
        "0",
        "--run.throughput_window",
        str(window),
        "--run.checkpoint_every",
        str(steps // 2 if kind == "preempt" else 0),
        "--model.optim.warmup_steps",
        "5",
    )
    return Case(name, kind, common + overrides, steps, data, log_every)


def zero(stage: int) -> tuple[str, ...]:
    return ("--trainer.strategy.init_args.config", f"configs/deepspeed/zero{stage}.json")


SIGMOID = ("--arch.attention.op", "sigmoid", "--arch.attention.normalizer", "none")
ELU1_KERNEL = ("--arch.attention.op", "kernel", "--arch.attention.kernel", "elu1")
SOFTPICK = ("--arch.attention.op", "softpick")
EAGER = ("--model.compile", "false")


def gpu_cases() -> list[Case]:
    p60 = ("--data.global_batch_tokens", "32768", "--data.micro_batch_size", "16", "--trainer.devices", "1")
    return [
        fit_case("60m-zero2", "paper-60m", "c2048", 60, *p60),
        fit_case("60m-zero2-eager", "paper-60m", "c2048", 60, *p60, *EAGER),
        fit_case("60m-single", "paper-60m", "c2048", 60, *p60, "--trainer.strategy", "auto"),
        fit_case("60m-zero1", "paper-60m", "c2048", 40, *p60, *zero(1)),
        fit_case("60m-zero3", "paper-60m", "c2048", 40, *p60, *zero(3)),
        fit_case("60m-fsdp2", "paper-60m", "c2048", 40, *p60, "--trainer.strategy", "fsdp2"),
        fit_case("small-softmax", "gpu-small", "c512", 60),
        fit_case("small-sigmoid", "gpu-small", "c512", 60, *SIGMOID),
        fit_case("small-elu1-kernel", "gpu-small", "c512", 60, *ELU1_KERNEL),
        fit_case("small-softpick", "gpu-small", "c512", 60, *SOFTPICK),
        fit_case(
            "1b-zero2",
            "paper-60m",
            "c2048",
            20,
            "--data.global_batch_tokens",
            "16384",
            "--data.micro_batch_size",
            "8",
            "--trainer.devices",
            "1",
            "--arch.preset",
            "llama-1b",
            window=5,
        ),
        fit_case("preempt", "paper-60m", "c2048", 60, *p60, kind="preempt"),
        Case("analyze", "analyze", ("-n", "20", "--no-plots", "--device", "cuda"), reads="60m-single"),
        Case(
            "stream-ppl",
            "stream-ppl",
            ("--max-tokens", "2048", "--cache", "0+512", "--cache", "4+508", "--device", "cuda"),
            reads="60m-single",
        ),
    ]


def cpu_cases(context: int = CONTEXT["cpu"]) -> list[Case]:
    """Toy stand-ins on the cpu-tiny recipe (a 2-layer d=32 model, 8 sequences a step), for the
    harness itself."""
    tiny = ("--trainer.accelerator", "cpu", "--data.global_batch_tokens", str(8 * context))
    two = ("--trainer.devices", "2", "--data.micro_batch_size", "2")
    return [
        fit_case("softmax", "cpu-tiny", "cpu", 8, *tiny, log_every=2, window=2),
        fit_case("sigmoid", "cpu-tiny", "cpu", 8, *tiny, *SIGMOID, log_every=2, window=2),
        fit_case("elu1-kernel", "cpu-tiny", "cpu", 8, *tiny, *ELU1_KERNEL, log_every=2, window=2),
        fit_case("softpick", "cpu-tiny", "cpu", 8, *tiny, *SOFTPICK, log_every=2, window=2),
        fit_case("compiled", "cpu-tiny", "cpu", 8, *tiny, "--model.compile", "true", log_every=2, window=2),
        fit_case(
            "zero2", "cpu-tiny", "cpu", 8, *tiny, *two, "--trainer.strategy", "deepspeed_stage_2", log_every=2, window=2
        ),
        fit_case("fsdp2", "cpu-tiny", "cpu", 8, *tiny, *two, "--trainer.strategy", "fsdp2", log_every=2, window=2),
        fit_case("preempt", "cpu-tiny", "cpu", 60, *tiny, kind="preempt", log_every=2, window=2),
        Case(
            "analyze", "analyze", ("-n", "8", "-T", "12", "--no-plots", "--device", "cpu"), data="cpu", reads="softmax"
        ),
        Case(
            "stream-ppl",
            "stream-ppl",
            ("--max-tokens", "256", "--cache", "2+30", "--device", "cpu"),
            data="cpu",
            reads="softmax",
        ),
    ]


@dataclass
class Result:
    case: str
    problem: str | None  # None: ok; else the first error line
    seconds: float
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak_gib: float | None = None


def first_error_line(log: str, code: int | None) -> str:
    """What went wrong, in one line: SinkLab's own refusal (`sinklab <command>: ...`), else the
    exception line of the last traceback, else the last line printed."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    ours = [line for line in lines if re.match(r"sinklab [\w-]+: (?!warning)", line)]
    raised = [line for line in lines if re.match(r"([\w.]+\.)?[A-Z]\w*(Error|Exception|Failed)\b", line)]
    line = ours[0] if ours else raised[-1] if raised else lines[-1] if lines else "no output"
    return f"exit {code}: {line}" if code else line


class Matrix:
    """Runs cases one after another under ``root`` (a run directory and a log per case)."""

    def __init__(self, cases: list[Case], root: Path, data: dict[str, Path], extra: list[str], timeout: float):
        self.cases = {c.name: c for c in cases}
        self.root, self.data, self.extra, self.timeout = root, data, extra, timeout

    def run(self, case: Case) -> Result:
        start = time.perf_counter()
        log = self.root / f"{case.name}.log"
        try:
            problem = getattr(self, "_" + case.kind.replace("-", "_"))(case, log)
        except subprocess.TimeoutExpired:
            problem = f"timed out after {self.timeout:.0f} s"
        result = Result(case.name, problem, time.perf_counter() - start)
        if case.kind in ("fit", "preempt"):
            self._speed(result, self.root / case.name / "metrics.jsonl")
        return result

    def _command(self, command: list[str], log: Path, wait: bool = True):
        with open(log, "a") as out:
            proc = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        if not wait:
            return proc
        try:
            return proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise

    def _fit_command(self, case: Case) -> list[str]:
        return [
            *SINKLAB,
            "fit",
            *case.args,
            "--data.path",
            str(self.data[case.data]),
            "--run-dir",
            str(self.root / case.name),
            "--resume",
            "auto",
            *self.extra,
        ]

    def _judge_fit(self, case: Case, code: int, log: Path) -> str | None:
        if code != 0:
            return first_error_line(log.read_text(errors="replace"), code)
        final = self._final_checkpoint(case)
        if not final.exists():
            return f"no final checkpoint {final.name}"
        problems = health_problems(self.root / case.name / "metrics.jsonl", case.steps, case.log_every)
        return problems[0] if problems else None

    def _final_checkpoint(self, case: Case) -> Path:
        return self.root / case.name / "checkpoints" / f"step-{case.steps:06d}.ckpt"

    def _fit(self, case: Case, log: Path) -> str | None:
        return self._judge_fit(case, self._command(self._fit_command(case), log), log)

    def _preempt(self, case: Case, log: Path) -> str | None:
        """The path of a SLURM job told to stop: SIGUSR1 once a third of the steps are logged
        (the handler is installed by then), a checkpoint at the next step boundary, exit 0; then
        a second start with --resume auto runs to the end."""
        metrics = self.root / case.name / "metrics.jsonl"
        proc, deadline = self._command(self._fit_command(case), log, wait=False), time.monotonic() + self.timeout
        while (
            proc.poll() is None
            and time.monotonic() < deadline
            and not any(step >= case.steps // 3 for step, _ in metric_rows(metrics, N.TRAIN_LOSS))
        ):
            time.sleep(0.05)
        if proc.poll() is None:
            proc.send_signal(signal.SIGUSR1)
        code = proc.wait(timeout=self.timeout)
        if code != 0:
            return "first start: " + first_error_line(log.read_text(errors="replace"), code)
        if "stopped by SIGUSR1" not in log.read_text(errors="replace"):
            return "the first start ran to the end: SIGUSR1 came too late to test the resume"
        return self._judge_fit(case, self._command(self._fit_command(case), log), log)

    def _analysis(self, command: list[str], log: Path, output: Path) -> str | None:
        code = self._command(command, log)
        if code != 0:
            return first_error_line(log.read_text(errors="replace"), code)
        return None if output.exists() else f"wrote no {output.name}"

    def _analyze(self, case: Case, log: Path) -> str | None:
        out, source = self.root / case.name, self._checkpoint_of(case)
        return self._analysis(
            [*SINKLAB, "analyze", str(source), "--dataset", str(self.data[case.data]), "--out", str(out), *case.args],
            log,
            out / "report.json",
        )

    def _stream_ppl(self, case: Case, log: Path) -> str | None:
        out, source = self.root / f"{case.name}.json", self._checkpoint_of(case)
        return self._analysis(
            [
                *SINKLAB,
                "stream-ppl",
                str(source),
                "--dataset",
                str(self.data[case.data]),
                "--out",
                str(out),
                *case.args,
            ],
            log,
            out,
        )

    def _checkpoint_of(self, case: Case) -> Path:
        return self._final_checkpoint(self.cases[case.reads])

    @staticmethod
    def _speed(result: Result, metrics: Path) -> None:
        def typical(key: str) -> float | None:
            values = [row[1] for row in metric_rows(metrics, key)]
            values = values[1:] if len(values) > 1 else values  # the first window holds compilation
            return statistics.median(values) if values else None

        result.tokens_per_s, result.mfu = typical(N.TOKENS_PER_S), typical(N.MFU)
        peaks = [row[1] for row in metric_rows(metrics, N.MAX_MEMORY_GIB)]
        result.peak_gib = max(peaks) if peaks else None


def table(results: list[Result], width: int = 64) -> str:
    def cell(value, fmt):
        return "-" if value is None else fmt.format(value)

    rows = [("case", "result", "tokens/s", "MFU", "peak mem", "time")]
    for r in results:
        verdict = "ok" if r.problem is None else "FAIL " + r.problem
        rows.append(
            (
                r.case,
                verdict if len(verdict) <= width else verdict[: width - 3] + "...",
                cell(r.tokens_per_s, "{:,.0f}"),
                cell(r.mfu and 100 * r.mfu, "{:.1f}%"),
                cell(r.peak_gib, "{:.1f} GiB"),
                f"{r.seconds:.0f} s",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    failed = [r for r in results if r.problem]
    lines += [f"{len(results) - len(failed)} of {len(results)} cases ok; {sum(r.seconds for r in results):.0f} s"]
    lines += [f"{r.case}: {r.problem}" for r in failed]
    return "\n".join(lines)


def prepare(key: str, path: Path) -> None:
    if not (path / "manifest.json").exists():
        subprocess.run(
            [*SINKLAB, "prep", "embedded", "--out", str(path), "--context-length", str(CONTEXT[key]), "--no-progress"],
            cwd=REPO,
            check=True,
        )


def context_of(dataset: Path) -> int:
    return json.loads((dataset / "manifest.json").read_text())["context_length"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--cases", help="comma list of case names (default: all of the device's)")
    parser.add_argument(
        "--data",
        type=Path,
        help="(cpu) a prepared dataset for every case (default: the embedded corpus at C = 64, prepared once)",
    )
    parser.add_argument("--extra-args", default="", help="appended to every `sinklab fit` (quoted, as one string)")
    parser.add_argument("--root", type=Path, help="where runs and logs go (default runs/gpu-check/<time>)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per command")
    args = parser.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu-check: needs a CUDA GPU (torch.cuda.is_available() is False); `--device cpu` runs the harness "
            "on toy cases",
            file=sys.stderr,
        )
        return 2
    data = dict(DATA, cpu=args.data) if args.data else dict(DATA)
    every = gpu_cases() if args.device == "cuda" else cpu_cases()  # names first: a refusal prepares nothing
    names = [c.name for c in every]
    wanted = [name.strip() for name in (args.cases or "").split(",") if name.strip()] or names
    if unknown := [n for n in wanted if n not in names]:
        parser.error(f"--cases: unknown {', '.join(unknown)}; the {args.device} cases are {', '.join(names)}")
    if missing := [c.reads for c in every if c.name in wanted and c.reads and c.reads not in wanted]:
        parser.error(f"--cases: {', '.join(missing)} must run too (the analysis cases read its checkpoint)")
    if args.device == "cpu":
        prepare("cpu", data["cpu"])
        every = cpu_cases(context_of(data["cpu"]))
    cases = [c for c in every if c.name in wanted]
    for key in sorted({c.data for c in cases}):
        prepare(key, data[key])
    root = args.root or REPO / "runs" / "gpu-check" / time.strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"gpu-check: {len(cases)} cases on {device}; torch {torch.__version__}; runs and logs in {root}", flush=True)
    matrix, results = Matrix(every, root, data, shlex.split(args.extra_args), args.timeout), []
    for case in cases:
        results.append(matrix.run(case))
        r = results[-1]
        print(f"  {case.name}: {'ok' if r.problem is None else 'FAIL ' + r.problem} ({r.seconds:.0f} s)", flush=True)
    (root / "results.json").write_text(json.dumps([vars(r) for r in results], indent=1))
    print(table(results))
    return 1 if any(r.problem for r in results) else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
