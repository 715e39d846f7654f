"""`sinklab fit`: train a recipe through ``SinkLabCLI`` and end every start cleanly: the run's final
status, its locks released, one line for each way it can fail (docs/training.md)."""

from __future__ import annotations

import logging
import re
import signal
import sys
import time
import warnings
from argparse import ArgumentError
from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist
from lightning.pytorch.trainer.states import TrainerStatus

from data_prep.dataset import DatasetError
from data_prep.errors import os_error_line
from pipeline.checkpoint import NonFiniteLossError, RunDirError
from pipeline.model.config import ConfigError
from pipeline.tracking import TAG_STATUS, RunLogger, log_run_model, pulled_argv
from sinklab_io.third_party import quiet_third_party

from .batching import BatchConfigError
from .fit_config import CHECK_ONLY, check_fit, negative_values_joined, parse_error_line
from .lightning_cli import SinkLabCLI, release_run_dirs
from .summary import print_summary

# what gloo and NCCL raise in a collective when another process of the run has gone
_PEER_LOST = re.compile(
    r"Connection (reset|closed) by peer|Broken pipe|NCCL communicator was aborted|"
    r"remote process exited|ProcessGroupNCCL.*(timeout|abort)",
    re.IGNORECASE,
)


def _lost_peer(trainer) -> str:
    """Which process of the run ended: the first of the processes this one launched that has
    exited (a run started without SLURM), else "another process of this run"."""
    procs = getattr(getattr(getattr(trainer, "strategy", None), "launcher", None), "procs", None) or []
    for local_rank, proc in enumerate(procs, start=1):
        try:
            code = proc.wait(timeout=2)
        except Exception:  # noqa: BLE001 - still running
            continue
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        return f"rank {trainer.node_rank * trainer.num_devices + local_rank} (pid {proc.pid}, {how})"
    return "another process of this run"


def _leave_process_group() -> None:
    """After a fit that returned on every rank: leave the process group together (a gloo group left to the
    interpreter's shutdown can abort the process, and srun then ends the whole step)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _finish(cli, trainer, status: str) -> None:
    """Rank 0: the run's final sinklab.status tag and MLflow status; locks released."""
    if (uploader := getattr(getattr(cli, "ckpt_cb", None), "uploader", None)) is not None:
        uploader.close()
    if trainer is not None and trainer.is_global_zero and isinstance(trainer.logger, RunLogger):
        trainer.logger.set_tag(TAG_STATUS, status)
        if status != "finished":
            trainer.logger.finalize(status)
    release_run_dirs()
    if status == "preempted" and trainer is not None and trainer.is_global_zero:
        print(f"sinklab fit: stopped by SIGUSR1 at step {cli.preemption_cb.stopped_at}, checkpoint saved", flush=True)
        cli.preemption_cb.requeue()


@contextmanager
def _start_up_notes_held() -> Iterator[None]:
    """Lightning's start-up notes held until the config is accepted: a refused start prints one line."""
    held: list[tuple[logging.Handler, logging.LogRecord]] = []
    holds = {  # a filter that keeps the record and lets nothing through
        handler: lambda record, handler=handler: held.append((handler, record))
        for name in ("lightning", "lightning.pytorch", "lightning.fabric")
        for handler in logging.getLogger(name).handlers
    }
    for handler, hold in holds.items():
        handler.addFilter(hold)
    try:
        yield
    finally:
        for handler, hold in holds.items():
            handler.removeFilter(hold)
    for handler, record in held:
        handler.handle(record)


def _failed(line: str, code: int) -> int:
    """``sinklab fit: <line>`` on stderr; returns the exit code."""
    print(f"sinklab fit: {line}", file=sys.stderr, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `sinklab fit ...` hands us argv without "fit"; Lightning's DDP launcher re-runs sys.argv as is
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    warnings.filterwarnings("ignore", message=".*srun. command is available on your system")
    quiet_third_party()
    cli = None
    status = "failed"
    try:
        argv = negative_values_joined(argv)
        if CHECK_ONLY in argv:
            check_fit([a for a in argv if a != CHECK_ONLY])
            print("sinklab fit: the config is accepted (--check-only: nothing was run or written)", flush=True)
            return 0
        argv = pulled_argv(argv)
        with _start_up_notes_held():
            cli = SinkLabCLI.build(argv)
        started = time.perf_counter()
        cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=cli.resume_from)
        # the whole fit, so that every sink probe (step 0's and the last one included) lies inside it
        fit_seconds = time.perf_counter() - started
        _leave_process_group()
        if cli.preemption_cb.stopped_at is not None:
            status = "preempted"
            return 0
        status = "finished"
        if cli.trainer.is_global_zero:
            log_run_model(cli)
            print_summary(cli, fit_seconds)
        return 0
    except NonFiniteLossError as exc:
        status = "nonfinite"
        return _failed(str(exc), 3)
    except (RunDirError, BatchConfigError, ConfigError, DatasetError, FileNotFoundError) as exc:
        return _failed(str(exc), 2)
    except RuntimeError as exc:
        if not _PEER_LOST.search(str(exc)):
            raise
        trainer = getattr(cli, "trainer", None)
        newest = cli.run_dir.newest_checkpoint() if cli is not None else None
        at = f" at step {trainer.global_step}" if trainer is not None else ""
        return _failed(
            f"{_lost_peer(trainer)} ended during training{at}, so this one stopped too; the newest "
            f"checkpoint ({newest.name if newest else 'none yet'}) is kept: continue with --resume auto",
            1,
        )
    except OSError as exc:  # a full disk or a file-size limit while writing a checkpoint: older ones are kept
        kept = cli is not None and cli.run_dir.step_checkpoints()
        line = os_error_line(exc, writing=str(cli.run_dir.checkpoints) if cli else None)
        return _failed(
            line + ("; the checkpoints already written are kept (continue with --resume auto)" if kept else ""), 2
        )
    except ArgumentError as exc:
        return _failed(f"{parse_error_line(str(exc))} (`sinklab fit --help` lists every option)", 2)
    except (KeyboardInterrupt, SystemExit) as exc:
        # Lightning turns Ctrl-C during fit into sys.exit(1) after marking the trainer interrupted
        trainer = getattr(cli, "trainer", None)
        interrupted = isinstance(exc, KeyboardInterrupt) or (
            trainer is not None and trainer.state.status == TrainerStatus.INTERRUPTED
        )
        if not interrupted:
            raise
        status = "interrupted"
        step = f" at step {trainer.global_step}" if trainer is not None else ""
        return _failed(f"interrupted{step}; continue it with --resume auto (from the newest checkpoint)", 130)
    finally:
        _finish(cli, getattr(cli, "trainer", None), status)
