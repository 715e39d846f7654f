"""The LightningModule: a SinkLab Transformer (built in ``configure_model``, where ZeRO-3 and FSDP2 expect it),
next-token loss, the optimizer and its schedule; checkpoints carry ``hyper_parameters["arch"]``."""

from __future__ import annotations

import math
import warnings

import lightning as L
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from torch.utils.checkpoint import checkpoint

from pipeline import metric_names as N
from pipeline.checkpoint import NonFiniteLossError, at_step_end
from pipeline.model import ConfigError, ModelConfig, Transformer
from pipeline.model.config import ARCH
from sinklab_io.notices import warn

from .compiling import compile_blocks, failure_line
from .init_from import SLOT_MARGIN, trainable_names
from .loss import next_token_loss
from .optim import OptimConfig, build_optimizer, build_scheduler
from .recording import record_metrics, reduced, set_tag
from .sharding import shard_model
from .spikes import SpikeGuard, drop_gradients, grad_norm, with_grads

# under DeepSpeed ours hands clipping over to Lightning's, which leaves it to the engine, as wanted
warnings.filterwarnings("ignore", message="Since DeepSpeed handles gradient clipping internally")


def _recomputed(forward):
    """The block's forward under non-reentrant activation checkpointing when gradients flow."""

    def run(*args, **kwargs):
        if torch.is_grad_enabled():
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return forward(*args, **kwargs)

    return run


def _reset_partitioned(model: Transformer, state: dict | None = None) -> None:
    """ZeRO-3's ``zero.Init`` partitioned the layers before the Transformer initialised them: initialise
    (or load ``state``) again on the gathered parameters on rank 0, so the initial weights are DDP's."""
    import deepspeed
    import torch.distributed as dist

    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
        if dist.get_rank() == 0:
            model.reset_parameters() if state is None else model.load_state_dict(state)


class SinkLabModule(L.LightningModule):
    """The model in training: its optimiser and schedule, its training and validation steps.

    Args:
        arch: the config's top-level ``arch`` (every field of pipeline.model.ModelConfig, e.g.
            ``--arch.attention.op sigmoid``); ``vocab_size`` is taken from the dataset's manifest.
        optim: the config's top-level ``optim`` (peak/min lr, warm-up, AdamW).
        compile: ``torch.compile`` each block (in place, so checkpoints keep their keys); where
            compiling fails the run trains uncompiled and says so in one line (pipeline.train.compiling).
        activation_checkpointing: recompute each block in backward instead of keeping activations.
        init: weights to start from (a checkpoint, an export directory or ``runs:/<run_id>``; or a
            pretrained HF model: smollm2, a .gguf file, an HF directory or hub id, whose config sets
            arch's shape): a new run, with a fresh optimizer, schedule and data order, that continues
            training a model; a sink logit or K/KV-bias slot that arch adds starts where the function is
            the source's. Ignored on a resume, which restores its own checkpoint.
        trainable: comma-separated globs of parameter names (``blocks.*.attn.sink_logit``) that train;
            the rest stay frozen, saved as they were (None: all train).
        slot_margin: how far below its head's smallest row log-sum-exp on the probe set an added slot's
            logit starts: 20 keeps the function (share <= e^-20); 4.6 gives that row 1%.
        slot_quantile: the row whose log-sum-exp slot_margin counts from, as a quantile of the head's rows
            (0: the smallest, which keeps every row; 0.5: the median row, where the slot can learn).
    """

    def __init__(
        self,
        arch: ModelConfig | None = None,
        optim: OptimConfig | None = None,
        compile: bool = False,
        activation_checkpointing: bool = False,
        init: str | None = None,
        trainable: str | None = None,
        slot_margin: float = SLOT_MARGIN,
        slot_quantile: float = 0.0,
    ):
        super().__init__()
        self.arch = arch if arch is not None else ModelConfig()
        self.optim = optim if optim is not None else OptimConfig()
        self.compile_blocks, self.activation_checkpointing = compile, activation_checkpointing
        self.init, self.trainable = init, trainable
        self.slot_margin, self.slot_quantile = slot_margin, slot_quantile
        self.init_state: dict[str, torch.Tensor] | None = None  # read_init() fills it at a fresh start
        self.model: Transformer | None = None
        self._step_loss, self._micro, self._val = 0.0, 0, []
        self.spike_guard: SpikeGuard | None = None  # run.skip_spikes (set by sinklab fit)
        self._step_value = math.nan  # the step's mean loss, for the guard
        self.save_hyperparameters({ARCH: self.arch.to_dict(), "optim": vars(self.optim).copy()})

    def configure_model(self) -> None:
        if self.model is not None:
            return
        if hasattr(dm := getattr(self._trainer, "datamodule", None), "manifest"):
            self.set_vocab(dm.manifest.vocab_size, dm.manifest.context_length)
        self.model = Transformer(self.arch)
        if self._trainer is not None and getattr(self.trainer.strategy, "zero_stage_3", False):
            _reset_partitioned(self.model, self.init_state)
        elif self.init_state is not None:
            self.model.load_state_dict(self.init_state)
        self.init_state = None
        if self.trainable is not None:  # requires_grad only on the parameters it names
            chosen = trainable_names(self.model, self.trainable)
            for name, p in self.model.named_parameters():
                p.requires_grad_(name in chosen)
        for block in self.model.blocks:
            if self.activation_checkpointing:
                block.forward = _recomputed(block.forward)
        if self.compile_blocks:
            compile_blocks(self.model.blocks, self._compile_failed)
        if self.device_mesh is not None:  # set by ModelParallelStrategy (--trainer.strategy fsdp2)
            shard_model(self.model, self.device_mesh)

    def _compile_failed(self, exc: BaseException) -> None:
        """One line on rank 0 (and a tag on the run): the run goes on uncompiled."""
        trainer = self._trainer
        if trainer is not None and not trainer.is_global_zero:
            return
        line = failure_line(exc)
        warn(
            "fit",
            f"torch.compile failed ({line}); training uncompiled, which is slower "
            "(docs/gpu.md). --model.compile false skips the attempt.",
        )
        set_tag(trainer, "sinklab.compile", f"failed, trained eager: {line}")

    def set_vocab(self, vocab_size: int, context_length: int, tokenizer_sha256: str | None = None) -> None:
        """The dataset's vocabulary (and its tokenizer's hash, kept in every checkpoint: `sinklab
        analyze` refuses a probe set of another tokenizer)."""
        if tokenizer_sha256:
            self.hparams["tokenizer_sha256"] = tokenizer_sha256
        cfg = self.arch.replace(vocab_size=vocab_size)
        if cfg.max_seq_len < context_length:
            raise ConfigError(
                f"arch.max_seq_len={cfg.max_seq_len} is below the dataset's context length "
                f"{context_length}; set it to at least {context_length}"
            )
        self.use_arch(cfg)

    def use_arch(self, cfg: ModelConfig) -> None:
        """Build ``cfg`` (the checkpoints' hyper_parameters say so too)."""
        self.arch = cfg
        self.hparams[ARCH] = cfg.to_dict()

    # ---- one optimizer step -------------------------------------------------------------------
    # Lightning's automatic optimisation runs step s (weights after s updates -> after s + 1) as:
    #
    #   for each of A micro-batches    A = trainer.accumulate_grad_batches (lightning_cli.py, from the batch plan)
    #       training_step              forward and next-token loss of one micro-batch (loss.py)
    #       (Lightning) backward       of loss / A; under DeepSpeed engine.backward (sharding.py: divided once)
    #   _end_of_step                   on the last micro-batch (at_step_end, the one boundary rule): the
    #                                  step's loss, mean over micro-batches and ranks, recorded as step s;
    #                                  a non-finite one stops every rank before the update
    #   configure_gradient_clipping    clip to trainer.gradient_clip_val; the spike guard (run.skip_spikes,
    #                                  spikes.py) at its end, after the clip and before the update
    #                                  (DeepSpeed calls it on every micro-batch; its engine clips and steps
    #                                  at the boundary)
    #   (Lightning) optimizer.step, zero_grad, lr_scheduler.step; global_step becomes s + 1
    #   on_train_batch_end where at_step_end: the callbacks in lightning_cli.py's order, StepCheckpoint,
    #                                  SinkMetrics, Throughput, Preemption (callbacks.py)
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        """One micro-batch: forward and loss (Lightning then runs backward); the step's end on the last."""
        loss = self.lm_loss(batch["input_ids"])
        self._step_loss = self._step_loss + loss.detach()
        self._micro += 1
        if at_step_end(self.trainer, batch_idx):
            self._end_of_step()
        return loss

    def _end_of_step(self) -> None:
        """Before the update: the step's mean loss over micro-batches and ranks; a non-finite one stops every rank."""
        value = self._step_value = reduced(self.trainer, self._step_loss / self._micro, "mean")
        self._step_loss, self._micro = 0.0, 0
        if not math.isfinite(value):
            raise NonFiniteLossError(
                f"non-finite training loss ({value}) at step {self.global_step}: stopping; the last good "
                "checkpoint is kept. Start a new run directory with a lower optim.lr or a longer "
                "warm-up (a resume restores the optimizer's lr from the checkpoint), or check the data."
            )
        # the step's mean over micro-batches and ranks, of step s (the weights after s updates)
        record_metrics(self, {N.TRAIN_LOSS: value}, bar=True, log=False)
        if self.global_step % max(1, self.trainer.log_every_n_steps) == 0:
            record_metrics(self, {N.TRAIN_LOSS: value, N.TRAIN_LR: self.trainer.optimizers[0].param_groups[0]["lr"]})

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Lightning's clipping, except under bf16 (no loss scaler), where torch's clips a fused AdamW that
        Lightning refuses for fp16's sake; DeepSpeed's engine clips itself."""
        norm = grad_norm(optimizer) if self.spike_guard is not None else None  # before the clip, as OLMo-core
        plugin = self.trainer.precision_plugin
        if not (gradient_clip_val and isinstance(plugin, MixedPrecision) and plugin.scaler is None):
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
        elif gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(with_grads(optimizer), gradient_clip_val)
        else:
            torch.nn.utils.clip_grad_norm_(with_grads(optimizer), gradient_clip_val)
        if norm is not None:  # after the clip, before the update: a spike's gradients are dropped (no update)
            if skip := self.spike_guard.check(self.global_step, self._step_value, norm):
                drop_gradients(optimizer)
            if skip or self.global_step % max(1, self.trainer.log_every_n_steps) == 0:
                record_metrics(self, {N.SKIPPED_STEPS: len(self.spike_guard.skipped), N.GRAD_NORM: norm})

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if self.spike_guard is not None and "spike_guard" in checkpoint:
            self.spike_guard.load_state_dict(checkpoint["spike_guard"])

    def loss_start(self) -> int:
        """Index of the first logit that counts: the prefix-LM loss starts at token p+1
        (section 6; p = 1 is ordinary LM), i.e. at logit p-1 (0-based)."""
        return max(self.arch.prefix_len - 1, 0) if self.arch.mask == "prefix" else 0

    def lm_loss(self, tokens: torch.Tensor) -> torch.Tensor:
        return next_token_loss(self.model, tokens, self.loss_start())

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self._val.append(self.lm_loss(batch).detach())

    def on_validation_epoch_start(self) -> None:
        self._val = []

    def on_validation_epoch_end(self) -> None:
        if not self._val or self.trainer.sanity_checking:
            return
        record_metrics(self, {N.VAL_LOSS: torch.stack(self._val).mean()}, reduce="mean", bar=True)

    def configure_optimizers(self):
        optimizer = build_optimizer(self.model, self.optim)
        scheduler = build_scheduler(optimizer, self.optim, self.trainer.max_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.spike_guard is not None:  # the rolling window: a resume decides as the run would have
            checkpoint["spike_guard"] = self.spike_guard.state_dict()
