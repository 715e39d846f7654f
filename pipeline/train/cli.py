"""`sinklab fit`: LightningCLI over SinkLabModule + SinkDataModule, plus the run directory.

    sinklab fit --config configs/recipes/embedded.yaml [--run-dir D] [--resume auto|never|PATH]
                [--arch.preset llama-60m] [--arch.attention.op sigmoid] [--model.optim.lr 1e-3]
                [--data.interventions.resample [1]] [--trainer.max_steps 100] [--run.sink_every 50] ...
    sinklab fit --check-only --config ... [overrides]   # parse and check the config; run and write nothing

Sections: ``arch`` (every ModelConfig field, a preset's numbers filled in where the config leaves
them out; linked into the LightningModule's ``arch`` argument), ``model`` (the LightningModule:
``model.optim``, ``model.compile``, ...), ``data``, ``trainer`` (Lightning's Trainer), ``run``
(run_options.RunOptions: names, cadences, the spike guard). Derived, not set by hand:
``trainer.accumulate_grad_batches`` (from data.global_batch_tokens) and ``trainer.val_check_interval``
(from run.val_every).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
import warnings
from argparse import ArgumentError
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.strategies import DeepSpeedStrategy
from lightning.pytorch.trainer.states import TrainerStatus
from lightning.pytorch.utilities import rank_zero_only

from data_prep.dataset import DatasetError
from data_prep.errors import os_error_line
from pipeline.checkpoint import (
    BesideTargetIO,
    NonFiniteLossError,
    RunDir,
    RunDirError,
    StepCheckpoint,
    acquire_lock,
    check_resume,
    release_lock,
    resume_path,
    start_over,
)
from pipeline.model.config import ConfigError, ModelConfig
from pipeline.model.config_keys import ARCH
from pipeline.tracking import (
    PARENT_ENV,
    TAG_EXPERIMENT,
    TAG_PARENT,
    TAG_PREVIOUS_RUN,
    TAG_RUN_DIR,
    TAG_SEED,
    TAG_STATUS,
    TAG_VARIANT,
    CheckpointUploader,
    RunLogger,
    as_params,
    code_version,
    log_run_model,
    open_run,
    pulled_argv,
    tracking_uri,
)

from .batching import BatchConfigError
from .callbacks import Preemption, SinkMetrics, Throughput
from .data import SinkDataModule
from .fit_config import (
    ARCH_TARGET,
    CHECK_ONLY,
    PARSER_MODE,
    as_plain,
    check_fit,
    negative_values_joined,
    parse_error_line,
    parse_fit,
    variant_summary,
)
from .module import SinkLabModule, read_init
from .progress import StepProgressBar
from .run_options import RunOptions
from .sharding import refuse_zero_optimizer  # also registers the strategy names fsdp2, deepspeed_stage_N
from .summary import print_summary

_LOCKED: list[RunDir] = []  # run dirs this process locked, released on the way out
_CREATED: list[Path] = []  # run dirs this process created, removed again if a failed start left them empty


class SinkLabCLI(LightningCLI):
    def init_parser(self, **kwargs: Any):
        return super().init_parser(**{"parser_mode": PARSER_MODE, **kwargs})

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_class_arguments(ModelConfig, ARCH)
        parser.link_arguments(ARCH, ARCH_TARGET, apply_on="parse")
        parser.add_class_arguments(RunOptions, "run")
        parser.add_argument("--run-dir", type=str | None, default=None, help="run directory (default runs/<run.name>)")
        parser.add_argument(
            "--resume",
            type=str,
            default="never",
            help="auto: newest checkpoint in the run dir (a fresh start if none); "
            "never: refuse a run dir that has checkpoints; a checkpoint path; or "
            "runs:/<run_id>: the newest checkpoint that run logged to MLflow "
            "(run.log_checkpoints), continued in a local run dir",
        )

    def parse_arguments(self, parser, args) -> None:
        self.config = parse_fit(parser, args)

    # ---- before any class exists: run dir and lock; nothing is written yet --------------------
    def before_instantiate_classes(self) -> None:
        cfg = self.config
        opts: RunOptions = RunOptions(**{k: v for k, v in dict(cfg["run"]).items()})
        opts.validate()
        self.opts = opts
        self.run = RunDir(Path(cfg.get("run_dir") or cfg.get("run-dir") or f"runs/{opts.name}"))
        if self.run.root.exists() and not self.run.root.is_dir():
            raise RunDirError(f"--run-dir {self.run.root}: is a file; name a directory (new, or a run to continue)")
        self.resume_from = resume_path(self.run, cfg.get("resume", "never"))
        # --resume auto found checkpoints but passed over every one: this start begins again at step 0
        self.start_over = self.resume_from is None and bool(self.run.step_checkpoints())
        self.rank0 = rank_zero_only.rank == 0
        self.run_id = None
        if not self.rank0:
            self.run_id = self.run.mlflow_run_id()
            return
        if not self.run.root.exists():
            _CREATED.append(self.run.root)
        acquire_lock(self.run)
        _LOCKED.append(self.run)

    # ---- every class built and checked: only now the config and the MLflow run are recorded ----
    def after_instantiate_classes(self) -> None:
        self.model.optim.validate(self.trainer.max_steps)
        refuse_zero_optimizer(self.model.optim.name, self.trainer.strategy)
        self.model.spike_guard = self.opts.spike_guard(self.trainer.strategy)
        manifest = self.datamodule.manifest
        self.model.set_vocab(manifest.vocab_size, manifest.context_length, manifest.tokenizer_sha256)  # max_seq_len too
        if self.opts.sink_every > 0 and manifest.probe.length > self.model.arch.max_seq_len:
            raise DatasetError(
                f"{manifest.root}/manifest.json: its probe set has sequences of {manifest.probe.length} tokens, more "
                f"than the model's {self.model.arch.max_seq_len} positions; prepare it with a probe length of "
                f"at most {manifest.context_length}, or turn the sink probe off (run.sink_every 0)"
            )
        self.resume_step = None
        if self.resume_from:  # before anything of this start is written: nothing to undo on a refusal
            self.resume_step = check_resume(
                Path(self.resume_from),
                self.model.arch.to_dict(),
                vars(self.model.optim),
                self.datamodule.order(),
                self.trainer.max_steps,
            )
        init_tags = {}
        if self.model.init and not self.resume_from:
            self.model.init_state, init_tags = read_init(self.model.init, self.model.arch)
        # only now, every setting accepted: a refused start creates no MLflow store
        self.trainer.logger = RunLogger(str(self.run.root), self.opts.experiment, self.run_id)
        if not self.rank0:
            return
        cfg, opts = self.config, self.opts
        previous_id = start_over(self.run) if self.start_over else None
        previous = {TAG_PREVIOUS_RUN: previous_id} if previous_id else {}
        self.run.create()
        stored = cfg.clone()
        stored["resume"] = None  # how this start was resumed is not part of the run's config
        config_file = self.run.save_config(self.parser.dump(stored, skip_validation=True))
        tags = {
            TAG_EXPERIMENT: opts.experiment,
            TAG_VARIANT: opts.variant or variant_summary(cfg),
            TAG_SEED: str(cfg.get("seed_everything")),
            "sinklab.code_version": code_version(),
            "sinklab.dataset_hash": self.datamodule.manifest.hash,
            TAG_RUN_DIR: str(self.run.root.resolve()),
            TAG_STATUS: "running",
            **previous,
        }
        if os.environ.get("SLURM_JOB_ID"):
            tags["sinklab.slurm_job_id"] = os.environ["SLURM_JOB_ID"]
        tags.update(init_tags)
        if os.environ.get(PARENT_ENV):  # set by `sinklab sweep`: the experiment's parent run
            tags[TAG_PARENT] = os.environ[PARENT_ENV]
        self.run_id = open_run(
            self.run,
            opts.experiment,
            opts.name,
            tags,
            as_params(as_plain(cfg)) | self.model.optimizer_split(),
            [config_file],
            manifest=self.datamodule.manifest,
        )
        self.trainer.logger.attach_run(self.run_id, self.resume_step)
        if opts.system_metrics:
            self.trainer.logger.start_system_metrics()
        if opts.log_checkpoints and self.run_id:
            self.ckpt_cb.uploader = CheckpointUploader(tracking_uri(), self.run_id)

    # ---- the trainer: logger, callbacks, SLURM, derived batch settings -------------------------
    def instantiate_trainer(self, **kwargs: Any):
        opts, data = self.opts, self.datamodule
        trainer_cfg = self._get(self.config_init, "trainer", default={})
        if trainer_cfg.get("accumulate_grad_batches", 1) != 1:
            raise ConfigError(
                "trainer.accumulate_grad_batches is derived from data.global_batch_tokens, "
                "data.micro_batch_size and the world size; leave it unset"
            )
        context = data.manifest.context_length
        self.sink_cb = SinkMetrics(opts.sink_every, opts.plot_every, self.run.root, flow=opts.flow)
        self.throughput_cb = Throughput(data.global_batch_tokens, context, opts.throughput_window)
        self.ckpt_cb = StepCheckpoint(self.run.root, opts.checkpoint_every, opts.keep_last)
        self.preemption_cb = Preemption(self.ckpt_cb)
        callbacks = list(trainer_cfg.get("callbacks") or []) + [
            self.ckpt_cb,
            self.sink_cb,
            self.throughput_cb,
            self.preemption_cb,
        ]
        if trainer_cfg.get("enable_progress_bar", True) is not False and not any(
            isinstance(cb, ProgressBar) for cb in callbacks
        ):
            callbacks.append(StepProgressBar())
        extra: dict[str, Any] = {
            "logger": False,  # the RunLogger comes once every setting is checked (after_instantiate_classes)
            "callbacks": callbacks,
            "default_root_dir": str(self.run.root),
            "use_distributed_sampler": False,
            "check_val_every_n_epoch": None,
            "max_epochs": -1,
        }
        extra["plugins"] = list(trainer_cfg.get("plugins") or []) + [BesideTargetIO()]
        if SLURMEnvironment.detect():  # requeue is ours (Preemption), at a step boundary
            extra["plugins"].append(SLURMEnvironment(auto_requeue=False))
        trainer = super().instantiate_trainer(**extra)
        if trainer.max_steps is None or trainer.max_steps == -1:
            raise ConfigError("trainer.max_steps must be set (the cosine schedule and the data order need it)")
        if trainer.max_steps < 1:
            raise ConfigError(f"trainer.max_steps={trainer.max_steps}: must be >= 1 (the number of optimizer steps)")
        plan = data.make_plan(trainer.world_size)
        trainer.accumulate_grad_batches = plan.grad_accum
        trainer.val_check_interval = max(1, opts.val_every) * plan.grad_accum
        if opts.val_every <= 0:  # 0 turns validation off, as 0 turns off the other periodic work
            trainer.limit_val_batches = 0
        self.plan = plan
        if isinstance(trainer.strategy, DeepSpeedStrategy) and trainer.strategy.config is not None:
            trainer.strategy.config.setdefault("train_micro_batch_size_per_gpu", plan.micro_batch_size)
        if rank_zero_only.rank == 0:
            print(f"sinklab: run dir {self.run.root}; batch: {plan.describe()}", flush=True)
        return trainer


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
    """Once fit has returned on every rank (finished or preempted alike), leave the process group
    together. A gloo group left to the interpreter's shutdown can abort the process ("terminate
    called without an active exception"), and an aborted rank makes srun end the whole step,
    rank 0 perhaps still in its end-of-fit plots. Not after a failure: the other ranks may never
    get here. Rank 0's MLflow upload comes after, so no rank waits on it."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _finish(cli, trainer, status: str) -> None:
    """Rank 0: the run's final sinklab.status tag and MLflow status; locks released."""
    uploader = getattr(getattr(cli, "ckpt_cb", None), "uploader", None)
    if uploader is not None:
        uploader.close()
    if trainer is not None and trainer.is_global_zero and isinstance(trainer.logger, RunLogger):
        trainer.logger.set_tag(TAG_STATUS, status)
        if status != "finished":
            trainer.logger.finalize(status)
    while _LOCKED:
        release_lock(_LOCKED.pop())
    while _CREATED:  # a start that failed before writing anything leaves no empty run dir behind
        root = _CREATED.pop()
        if root.is_dir() and not any(root.iterdir()):
            root.rmdir()
    if status == "preempted" and trainer is not None and trainer.is_global_zero:
        print(f"sinklab fit: stopped by SIGUSR1 at step {cli.preemption_cb.stopped_at}, checkpoint saved", flush=True)
        cli.preemption_cb.requeue()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `sinklab fit ...` hands us argv without "fit"; Lightning's DDP launcher re-runs sys.argv as is
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
    warnings.filterwarnings("ignore", message=".*srun. command is available on your system")
    warnings.filterwarnings("ignore", message=".*litlogger")
    cli = None
    status = "failed"
    try:
        argv = negative_values_joined(argv)
        if CHECK_ONLY in argv:
            check_fit([a for a in argv if a != CHECK_ONLY])
            print("sinklab fit: the config is accepted (--check-only: nothing was run or written)", flush=True)
            return 0
        argv = pulled_argv(argv)
        cli = SinkLabCLI(
            SinkLabModule,
            SinkDataModule,
            args=argv,
            run=False,
            save_config_callback=None,
            auto_configure_optimizers=False,
            seed_everything_default=1234,
            parser_kwargs={"default_env": False, "exit_on_error": False},
        )
        started = time.perf_counter()
        cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=cli.resume_from)
        # the whole fit, so that every sink probe (step 0's and the last one included) lies inside it
        cli.fit_seconds = time.perf_counter() - started
        _leave_process_group()
        if cli.preemption_cb.stopped_at is not None:
            status = "preempted"
            return 0
        status = "finished"
        if cli.trainer.is_global_zero:
            log_run_model(cli)
            print_summary(cli)
        return 0
    except NonFiniteLossError as exc:
        status = "nonfinite"
        print(f"sinklab fit: {exc}", file=sys.stderr, flush=True)
        return 3
    except (RunDirError, BatchConfigError, ConfigError, DatasetError, FileNotFoundError) as exc:
        print(f"sinklab fit: {exc}", file=sys.stderr, flush=True)
        return 2
    except RuntimeError as exc:
        if not _PEER_LOST.search(str(exc)):
            raise
        trainer = getattr(cli, "trainer", None)
        newest = cli.run.newest_checkpoint() if cli is not None else None
        at = f" at step {trainer.global_step}" if trainer is not None else ""
        print(
            f"sinklab fit: {_lost_peer(trainer)} ended during training{at}, so this one stopped too; the newest "
            f"checkpoint ({newest.name if newest else 'none yet'}) is kept: continue with --resume auto",
            file=sys.stderr,
            flush=True,
        )
        return 1
    except OSError as exc:  # a full disk or a file-size limit while writing a checkpoint: older ones are kept
        kept = cli is not None and cli.run.step_checkpoints()
        print(
            f"sinklab fit: {os_error_line(exc, writing=str(cli.run.checkpoints) if cli else None)}"
            + ("; the checkpoints already written are kept (continue with --resume auto)" if kept else ""),
            file=sys.stderr,
            flush=True,
        )
        return 2
    except ArgumentError as exc:
        print(
            f"sinklab fit: {parse_error_line(str(exc))} (`sinklab fit --help` lists every option)",
            file=sys.stderr,
            flush=True,
        )
        return 2
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
        print(
            f"sinklab fit: interrupted{step}; continue it with --resume auto (from the newest checkpoint)",
            file=sys.stderr,
            flush=True,
        )
        return 130
    finally:
        _finish(cli, getattr(cli, "trainer", None), status)
