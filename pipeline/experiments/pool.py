"""A warm worker for a local sweep: `sinklab fit`'s modules imported once, each run a child forked from it.

Protocol: one JSON request per line on stdin (`{"argv": [...], "log": PATH, "env": {...}}`), one answer per line on
stdout (`{"code": EXIT_STATUS}`), after a first line `{"ready": SECONDS_OF_IMPORTS}`.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

CODE_ROOT = Path(__file__).resolve().parents[2]  # the checkout the sweep runs from, first on the worker's path
WARM_MODULES = ("pipeline.cli", "pipeline.train.cli", "pipeline.tracking.logger", "pipeline.tracking.run_assets")


class WorkerError(RuntimeError):
    """The worker process ended or answered out of protocol."""


def subprocess_runner(run, command: list[str]) -> int:
    """A sweep's runner that starts `command` as a process of its own, its output in <run_dir>/sweep.log."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    with open(run.log, "ab") as log:
        return subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode


class ForkServer:
    """A sweep's runner (`sweep.Runner`): one `sinklab fit` per call in a child of the worker, started lazily."""

    process: subprocess.Popen | None = None

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            raise WorkerError(f"the sweep's worker process ended (exit {code}) before answering")
        return json.loads(line)

    def __call__(self, run, command: list[str]) -> int:
        if self.process is None:
            boot = f"import sys; sys.path.insert(0, {str(CODE_ROOT)!r}); from pipeline.experiments.pool import serve"
            self.process = subprocess.Popen(
                [sys.executable, "-c", f"{boot}; serve()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            self._answer()  # the "ready" line
        request = {"argv": command[command.index("fit") + 1 :], "log": str(run.log), "env": dict(os.environ)}
        print(json.dumps(request), file=self.process.stdin, flush=True)
        return int(self._answer()["code"])

    def close(self) -> None:
        if self.process is not None:
            self.process.stdin.close()
            self.process.wait()
            self.process = None


def _run_child(request: dict) -> None:
    """In the forked child: `sinklab fit ARGV` with output to the log; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C interrupts the run, as in fit
        os.environ.clear()
        os.environ.update(request["env"])
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # not the worker's request pipe
        os.dup2(log, 1)  # not the worker's answer pipe
        os.dup2(log, 2)
        from pipeline.cli import main

        code = int(main(["fit", *request["argv"]]) or 0)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:  # noqa: BLE001  (reported in the run's log, as the interpreter would)
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()  # what a process's normal exit runs (MLflow and logging flush here)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve() -> None:
    """The worker's loop: import once, then fork one child per request (its run dir made first) and wait for it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the running child's; stdin's end stops us
    started = time.perf_counter()
    for name in WARM_MODULES:
        importlib.import_module(name)
    print(json.dumps({"ready": round(time.perf_counter() - started, 2)}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        Path(request["log"]).parent.mkdir(parents=True, exist_ok=True)
        pid = os.fork()
        if pid == 0:
            _run_child(request)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)
