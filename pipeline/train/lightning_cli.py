"""``SinkLabCLI``: LightningCLI over SinkLabModule + SinkDataModule, with the sections ``arch``, ``optim``,
``model``, ``data``, ``trainer`` and ``run``, plus the run directory and the MLflow run."""

from __future__ import annotations

import os
from argparse import SUPPRESS
from pathlib import Path
from typing import Any

import torch
from jsonargparse import set_parsing_settings
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.strategies import DeepSpeedStrategy
from lightning.pytorch.utilities import rank_zero_only

from data_prep.dataset import DatasetError
from pipeline.checkpoint import (
    BesideTargetIO,
    RunDir,
    RunDirError,
    StepCheckpoint,
    acquire_lock,
    check_resume,
    release_lock,
    resume_path,
    start_over,
)
from pipeline.model import Transformer
from pipeline.model.config import ARCH, ConfigError, ModelConfig
from pipeline.tracking import (
    PARENT_ENV,
    TAG_CODE_VERSION,
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
    open_run,
    tracking_uri,
)

from .callbacks import Preemption, SinkMetrics, Throughput
from .data import SinkDataModule
from .fit_config import ARCH_TARGET, OPTIM, OPTIM_TARGET, PARSER_MODE, as_plain, parse_fit, set_arch, variant_summary
from .init_from import init_arch, read_init, trainable_names
from .module import SinkLabModule
from .optim import OptimConfig, optimizer_split
from .progress import StepProgressBar
from .run_options import RunOptions
from .sharding import refuse_zero_optimizer  # also registers the strategy names fsdp2, deepspeed_stage_N

_TAKEN: list[tuple[RunDir, bool]] = []  # run dirs this process locks, and whether it creates them


class SinkLabCLI(LightningCLI):
    """Parse and check the config, take the run dir, build the trainer, then open the MLflow run."""

    @classmethod
    def build(cls, args: list[str]):
        """`sinklab fit`'s CLI over ``args``, everything built and nothing run."""
        return cls(
            SinkLabModule,
            SinkDataModule,
            args=args,
            run=False,
            save_config_callback=None,
            auto_configure_optimizers=False,
            seed_everything_default=1234,
            parser_kwargs={"default_env": False, "exit_on_error": False},
        )

    def init_parser(self, **kwargs: Any):
        set_parsing_settings(docstring_parse_attribute_docstrings=True)  # each field's docstring is its --help line
        return super().init_parser(**{"parser_mode": PARSER_MODE, **kwargs})

    def add_arguments_to_parser(self, parser) -> None:
        for config, key, target in ((ModelConfig, ARCH, ARCH_TARGET), (OptimConfig, OPTIM, OPTIM_TARGET)):
            parser.add_class_arguments(config, key)
            parser.link_arguments(key, target, apply_on="parse")
        hidden = {ARCH_TARGET, OPTIM_TARGET, f"{ARCH_TARGET}.help", f"{OPTIM_TARGET}.help"}
        for action in parser._actions:  # the links' targets: set from `arch` and `optim`, never given
            action.help = SUPPRESS if action.dest in hidden else action.help
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
        self.options = RunOptions(**dict(cfg["run"]))
        self.options.validate()
        self.run_dir = RunDir(Path(cfg.get("run_dir") or cfg.get("run-dir") or f"runs/{self.options.name}"))
        if self.run_dir.root.exists() and not self.run_dir.root.is_dir():
            raise RunDirError(f"--run-dir {self.run_dir.root}: is a file; name a directory (new, or a run to continue)")
        self.resume_from = resume_path(self.run_dir, cfg.get("resume", "never"))
        # --resume auto found checkpoints but passed over every one: this start begins again at step 0
        self.start_over = self.resume_from is None and bool(self.run_dir.step_checkpoints())
        self.rank0 = rank_zero_only.rank == 0
        self.mlflow_run_id = None if self.rank0 else self.run_dir.mlflow_run_id()
        if self.rank0:
            _TAKEN.append((self.run_dir, not self.run_dir.root.exists()))
            acquire_lock(self.run_dir)

    # ---- every class built and checked: only now the config and the MLflow run are recorded ----
    def after_instantiate_classes(self) -> None:
        self.model.optim.validate(self.trainer.max_steps)
        refuse_zero_optimizer(self.model.optim.name, self.trainer.strategy)
        self.model.spike_guard = self.options.spike_guard(self.trainer.strategy, self.trainer.max_steps)
        manifest = self.datamodule.manifest
        self.model.set_vocab(manifest.vocab_size, manifest.context_length, manifest.tokenizer_sha256)  # max_seq_len too
        if self.model.init:  # a pretrained HF source sets the shape; the run may add slots
            self.model.use_arch(init_arch(self.model.init, self.model.arch, manifest.vocab_size))
        with torch.device("meta"):  # its parameters' names and sizes: no memory, no initialisation
            meta = Transformer(self.model.arch)
        if self.model.trainable is not None:
            trainable_names(meta, self.model.trainable)
        set_arch(self.config, self.model.arch)  # config.yaml and the MLflow params: the vocabulary it trains
        if self.options.sink_every > 0 and manifest.probe.length > self.model.arch.max_seq_len:
            raise DatasetError(
                f"{manifest.root}/manifest.json: its probe set has sequences of {manifest.probe.length} tokens, more "
                f"than the model's {self.model.arch.max_seq_len} positions; prepare it with a probe length of "
                f"at most {manifest.context_length}, or turn the sink probe off (run.sink_every 0)"
            )
        # before anything of this start is written: nothing to undo on a refusal
        self.resume_step = self.resume_from and check_resume(
            Path(self.resume_from),
            self.model.arch.to_dict(),
            vars(self.model.optim),
            self.datamodule.order(),
            self.trainer.max_steps,
        )
        init_tags = {}
        if self.model.init and not self.resume_from:
            probe = self.datamodule.probe_tokens()
            self.model.init_state, init_tags = read_init(
                self.model.init, self.model.arch, probe, self.model.slot_margin, self.model.slot_quantile
            )
        # only now, every setting accepted: a refused start creates no MLflow store
        self.trainer.logger = RunLogger(str(self.run_dir.root), self.options.experiment, self.mlflow_run_id)
        if not self.rank0:
            return
        cfg, options = self.config, self.options
        previous_id = start_over(self.run_dir) if self.start_over else None
        self.run_dir.create()
        stored = cfg.clone()
        stored["resume"] = None  # how this start was resumed is not part of the run's config
        config_file = self.run_dir.save_config(self.parser.dump(stored, skip_validation=True))
        tags = {
            TAG_EXPERIMENT: options.experiment,
            TAG_VARIANT: options.variant or variant_summary(cfg),
            TAG_SEED: str(cfg.get("seed_everything")),
            TAG_CODE_VERSION: code_version(),
            "sinklab.dataset_hash": self.datamodule.manifest.hash,
            TAG_RUN_DIR: str(self.run_dir.root.resolve()),
            TAG_STATUS: "running",
            TAG_PREVIOUS_RUN: previous_id,
            "sinklab.slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            TAG_PARENT: os.environ.get(PARENT_ENV),  # set by `sinklab sweep`: the experiment's parent run
            **init_tags,
        }
        self.mlflow_run_id = open_run(
            self.run_dir,
            options.experiment,
            options.name,
            {k: v for k, v in tags.items() if v},
            as_params(as_plain(cfg)) | optimizer_split(meta, self.model.optim),
            [config_file],
            manifest=self.datamodule.manifest,
        )
        self.trainer.logger.attach_run(self.mlflow_run_id, self.resume_step)
        print(f"sinklab: run dir {self.run_dir.root}; batch: {self.plan.describe()}", flush=True)  # every check passed
        if options.system_metrics:
            self.trainer.logger.start_system_metrics()
        if options.log_checkpoints and self.mlflow_run_id:
            self.ckpt_cb.uploader = CheckpointUploader(tracking_uri(), self.mlflow_run_id)

    # ---- the trainer: logger, callbacks, SLURM, derived batch settings -------------------------
    def instantiate_trainer(self, **kwargs: Any):
        options, data = self.options, self.datamodule
        trainer_cfg = self._get(self.config_init, "trainer", default={})
        if trainer_cfg.get("accumulate_grad_batches", 1) != 1:
            raise ConfigError(
                "trainer.accumulate_grad_batches is derived from data.global_batch_tokens, "
                "data.micro_batch_size and the world size; leave it unset"
            )
        self.sink_cb = SinkMetrics(options.sink_every, options.plot_every, self.run_dir.root, flow=options.flow)
        self.ckpt_cb = StepCheckpoint(self.run_dir.root, options.checkpoint_every, options.keep_last)
        self.preemption_cb = Preemption(self.ckpt_cb)
        callbacks = list(trainer_cfg.get("callbacks") or []) + [
            self.ckpt_cb,
            self.sink_cb,
            Throughput(data.global_batch_tokens, data.manifest.context_length, options.throughput_window),
            self.preemption_cb,
        ]
        if trainer_cfg.get("enable_progress_bar", True) is not False and not any(
            isinstance(cb, ProgressBar) for cb in callbacks
        ):
            callbacks.append(StepProgressBar())
        extra: dict[str, Any] = {
            "logger": False,  # the RunLogger comes once every setting is checked (after_instantiate_classes)
            "callbacks": callbacks,
            "default_root_dir": str(self.run_dir.root),
            "use_distributed_sampler": False,
            "check_val_every_n_epoch": None,
            "max_epochs": -1,
            "plugins": [*(trainer_cfg.get("plugins") or []), BesideTargetIO()],
        }
        if SLURMEnvironment.detect():  # requeue is ours (Preemption), at a step boundary
            extra["plugins"].append(SLURMEnvironment(auto_requeue=False))
        trainer = super().instantiate_trainer(**extra)
        if trainer.max_steps is None or trainer.max_steps == -1:
            raise ConfigError("trainer.max_steps must be set (the cosine schedule and the data order need it)")
        if trainer.max_steps < 1:
            raise ConfigError(f"trainer.max_steps={trainer.max_steps}: must be >= 1 (the number of optimizer steps)")
        plan = self.plan = data.make_plan(trainer.world_size)
        trainer.accumulate_grad_batches = plan.grad_accum
        trainer.val_check_interval = max(1, options.val_every) * plan.grad_accum
        if options.val_every <= 0:  # 0 turns validation off, as 0 turns off the other periodic work
            trainer.limit_val_batches = 0
        if isinstance(trainer.strategy, DeepSpeedStrategy) and trainer.strategy.config is not None:
            trainer.strategy.config.setdefault("train_micro_batch_size_per_gpu", plan.micro_batch_size)
        return trainer


def release_run_dirs() -> None:
    """Unlock the run dirs this process locked; remove those it created and left empty."""
    while _TAKEN:
        run, created = _TAKEN.pop()
        release_lock(run)  # only a lock this process holds
        if created and run.root.is_dir() and not any(run.root.iterdir()):  # a start that wrote nothing
            run.root.rmdir()
