"""Run a guide of docs/guides/ as written: its ```bash blocks in order, each checked against the ```text
block that follows it.

Marks in the guide, HTML comments the reader does not see, apply to the next block:
  <!-- test: skip REASON -->                  not run (an install, a site's own setting)
  <!-- test: replace `OLD` with `NEW` -->     the sizes the suite runs at (repeatable; the shell expands NEW)
  <!-- test: wait-until `COMMAND` -->         before the block: poll COMMAND until it succeeds

A ```text block after a command block is the output it promises, a shape: its lines must appear in the output in this order, ``...`` in a line
matches any text, ``<name>`` any word, and a line of ``...`` alone any lines.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "guides"
MARK = re.compile(r"^<!--\s*test:\s*(.*?)\s*-->", re.S | re.M)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)


@dataclass
class Step:
    """One ```bash block of a guide and what the suite does with it."""

    line: int
    command: str
    expected: str | None = None
    skip: str | None = None
    replace: list[tuple[str, str]] = field(default_factory=list)
    wait_until: list[str] = field(default_factory=list)

    def script(self, env: dict[str, str]) -> str:
        text = self.command
        for old, new in self.replace:
            if old not in text:
                raise AssertionError(f"guide line {self.line}: `{old}` is not in the block it overrides:\n{text}")
            text = text.replace(old, new)
        return text


def steps(guide: str) -> list[Step]:
    """The guide's command blocks with their marks and expected output, in order."""
    text = (DOCS / guide).read_text()
    found: list[Step] = []
    pending: list[str] = []
    pos = 0
    for fence in FENCE.finditer(text):
        pending += MARK.findall(text[pos : fence.start()])
        pos = fence.end()
        lang, body = fence.group(1), fence.group(2)
        if lang == "text" and found and found[-1].expected is None:
            found[-1].expected = body
            continue
        if lang != "bash":
            continue
        step = Step(line=text.count("\n", 0, fence.start()) + 1, command=body)
        for mark in pending:
            if mark.startswith("skip"):
                step.skip = mark[4:].strip() or "marked skip"
            elif m := re.fullmatch(r"replace `(.+?)` with `(.*?)`", mark, re.S):
                step.replace.append((m.group(1), m.group(2)))
            elif m := re.fullmatch(r"wait-until `(.+?)`", mark, re.S):
                step.wait_until.append(m.group(1))
            else:
                raise AssertionError(f"{guide}: unknown test mark {mark!r} before line {step.line}")
        pending = []
        found.append(step)
    return found


def shape_regex(line: str) -> re.Pattern:
    parts = re.split(r"(\.\.\.|<[A-Za-z][\w -]*>)", line.strip())
    literal = lambda p: r"\s+".join(map(re.escape, re.split(r"\s+", p)))  # any run of spaces
    pattern = "".join(".*" if p == "..." else r"\S+" if p.startswith("<") else literal(p) for p in parts)
    return re.compile(pattern)


def check_shape(output: str, expected: str, where: str) -> None:
    """Every line of ``expected`` (but ``...`` lines) matches an output line, in order."""
    lines = [line.strip() for line in output.splitlines()]
    at = 0
    for want in expected.splitlines():
        if want.strip() in ("", "..."):
            continue
        pattern = shape_regex(want)
        while at < len(lines) and not pattern.fullmatch(lines[at]):
            at += 1
        if at == len(lines):
            raise AssertionError(
                f"{where}: no output line shaped {want.strip()!r} (in order); output:\n{output[-4000:]}"
            )
        at += 1


class GuideShell:
    """Runs the steps in one working directory, the environment carried from block to block as a shell's
    would be; background processes a block starts are stopped by :meth:`close`."""

    def __init__(self, cwd: Path, env: dict[str, str], poll=None) -> None:
        self.cwd, self.env, self.poll = cwd, dict(env), poll
        self.state = cwd / ".guide-env"
        self.groups: list[int] = []
        self.log: list[tuple[int, float, str]] = []  # (line, seconds, output) of each block run

    def run(self, step: Step, timeout: float = 300) -> str:
        for condition in step.wait_until:
            self.wait(condition, step.line)
        script = step.script(self.env)
        save = f"export -p > {shlex.quote(str(self.state))}"
        load = f"source {shlex.quote(str(self.state))}; " if self.state.exists() else ""
        # errexit per block; the environment is kept only after the whole block ran
        full = f"{load}set -eo pipefail\n{script}\n{save}\n"
        started = time.time()
        proc = subprocess.Popen(
            ["bash", "-c", full],
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.groups.append(proc.pid)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop(proc.pid)
            raise AssertionError(f"guide line {step.line}: still running after {timeout} s:\n{script}") from None
        self.log.append((step.line, time.time() - started, out))
        if proc.returncode != 0:
            raise AssertionError(
                f"guide line {step.line} failed (exit {proc.returncode}):\n{script}\n---\n{out[-4000:]}"
            )
        if step.expected is not None:
            check_shape(out, step.expected, f"guide line {step.line}")
        return out

    def wait(self, condition: str, line: int, timeout: float = 420) -> None:
        load = f"source {shlex.quote(str(self.state))}; " if self.state.exists() else ""
        deadline = time.time() + timeout
        while subprocess.run(
            ["bash", "-c", load + condition], cwd=self.cwd, env=self.env, capture_output=True
        ).returncode:
            if self.poll:
                self.poll()
            if time.time() > deadline:
                raise AssertionError(f"guide line {line}: `{condition}` still false after {timeout} s")
            time.sleep(0.5)

    def exported(self, name: str) -> str | None:
        """A variable as the guide's shell holds it after the last block."""
        done = subprocess.run(
            ["bash", "-c", f'source {shlex.quote(str(self.state))}; printf %s "${{{name}:-}}"'],
            env=self.env,
            capture_output=True,
            text=True,
        )
        return done.stdout or None

    @staticmethod
    def stop(pgid: int) -> None:
        try:
            os.killpg(pgid, signal.SIGTERM)
            for _ in range(100):
                os.killpg(pgid, 0)
                time.sleep(0.1)
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        for pgid in reversed(self.groups):
            self.stop(pgid)


def run_guide(guide: str, shell: GuideShell, until_line: int | None = None, after_line: int = 0) -> list[Step]:
    """Run the guide's blocks (but those marked skip) in order, those from ``after_line`` (exclusive) to
    ``until_line`` (inclusive) where given; return the steps skipped."""
    skipped = []
    for step in steps(guide):
        if step.line <= after_line:
            continue
        if until_line is not None and step.line > until_line:
            break
        if step.skip:
            skipped.append(step)
            continue
        shell.run(step)
    return skipped


def guide_env(home: Path, bin_dir: Path, **extra: str) -> dict[str, str]:
    """A new user's shell: `sinklab` (this checkout's) and `mlflow` on PATH, a home of its own, nothing of
    MLflow or SinkLab set; ``extra`` as GUIDE_* variables the test marks use."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    sinklab = bin_dir / "sinklab"
    sinklab.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m pipeline.cli "$@"\n')
    sinklab.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "SINKLAB_"))}
    venv = Path(sys.executable).parents[1]
    env.update(
        HOME=str(home),
        PATH=f"{bin_dir}:{venv / 'bin'}:{env['PATH']}",
        PYTHONPATH=str(REPO),
        OMP_NUM_THREADS="1",
        GUIDE_VENV=str(venv),
        **{f"GUIDE_{k.upper()}": v for k, v in extra.items()},
    )
    return env
