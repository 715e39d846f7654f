"""Training data: a deterministic global order over memory-mapped packed sequences.

Epoch e is the permutation ``default_rng([seed, e])`` of the sequences in use; sample g is
``perm_{g // n}[g % n]``; step s consumes samples [s*G, (s+1)*G), and micro-step a gives rank r
those from s*G + (a*W + r)*m. The loader's state is the samples consumed by completed steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from data_prep.dataset import DatasetError, PackedSplit, load_manifest, load_probe
from data_prep.dataset import verify as verify_dataset

from .batching import BatchPlan, plan_batch
from .interventions import Interventions, apply_interventions


class GlobalOrder:
    """Sample index g -> (epoch, sequence index); permutations cached per epoch."""

    def __init__(self, n_total: int, seed: int, budget_sequences: int | None = None):
        self.seed = seed
        if budget_sequences is not None and budget_sequences < n_total:
            self.pool = np.sort(np.random.default_rng([seed, 0xB0D6E7]).permutation(n_total)[:budget_sequences])
        else:
            self.pool = np.arange(n_total)
        self.n = len(self.pool)
        self._perms: dict[int, np.ndarray] = {}

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) > 2:
                self._perms.pop(min(self._perms))
            self._perms[epoch] = self.pool[np.random.default_rng([self.seed, epoch]).permutation(self.n)]
        return self._perms[epoch]

    def lookup(self, g: int) -> tuple[int, int]:
        epoch, i = divmod(g, self.n)
        return epoch, int(self.permutation(epoch)[i])


class RankBatchSampler(Sampler[list[int]]):
    """Yields this rank's micro-batches as lists of global sample indices."""

    def __init__(self, plan: BatchPlan, rank: int, total_steps: int):
        self.plan, self.rank, self.total_steps = plan, rank, total_steps
        self.batch_size = plan.micro_batch_size  # read by Lightning's DeepSpeed strategy
        self.start_sample = 0

    def __len__(self) -> int:
        return self.total_steps * self.plan.grad_accum

    def __iter__(self) -> Iterator[list[int]]:
        p, G = self.plan, self.plan.global_batch_seqs
        for step in range(self.start_sample // G, self.total_steps):
            for a in range(p.grad_accum):
                start = step * G + (a * p.world_size + self.rank) * p.micro_batch_size
                yield list(range(start, start + p.micro_batch_size))


def check_token_ids(tokens: np.ndarray, split: PackedSplit, indices) -> np.ndarray:
    """Refuse a batch holding an id outside the vocabulary (a damaged shard), not an index error later."""
    vocab = split.manifest.vocab_size
    if tokens.size and (tokens.max() >= vocab or tokens.min() < 0):
        row = int(np.argmax((tokens >= vocab).any(axis=1) | (tokens < 0).any(axis=1)))
        raise DatasetError(
            f"{split.manifest.root}: {split.split} sequence {int(np.asarray(indices)[row])} holds token id "
            f"{int(tokens[row].max())}, outside the vocabulary of {vocab} (manifest.json); a shard is damaged: "
            "check it with --data.verify true, and re-run `sinklab prep`"
        )
    return tokens


class PackedTrainSet(Dataset):
    """Global sample index -> dict(input_ids, sample, epoch); ``intervene(tokens, samples,
    epochs)`` applies the interventions per row (``SinkDataModule.intervene``)."""

    def __init__(self, split: PackedSplit, order: GlobalOrder, intervene: Callable[..., np.ndarray]):
        self.split, self.order, self.intervene = split, order, intervene

    def __getitems__(self, samples: list[int]) -> dict[str, torch.Tensor]:
        epochs, indices = map(np.array, zip(*(self.order.lookup(g) for g in samples)))
        tokens = check_token_ids(self.split.take(indices), self.split, indices)
        tokens = self.intervene(tokens, np.asarray(samples), epochs)
        return {
            "input_ids": torch.from_numpy(tokens),
            "sample": torch.tensor(samples),
            "epoch": torch.from_numpy(epochs),
        }


class StatefulLoader(DataLoader):
    """A DataLoader Lightning can checkpoint (it saves loaders that have state_dict)."""

    def __init__(
        self, dataset: PackedTrainSet, sampler: RankBatchSampler, consumed_samples: Callable[[], int], **kwargs
    ):
        super().__init__(dataset, batch_sampler=sampler, collate_fn=_identity, **kwargs)
        self._consumed_samples = consumed_samples

    def state_dict(self) -> dict:
        order = self.dataset.order
        return {
            "consumed_samples": int(self._consumed_samples()),
            "global_batch_seqs": self.batch_sampler.plan.global_batch_seqs,
            "seed": order.seed,
            "n_sequences": order.n,
        }

    def load_state_dict(self, state: dict) -> None:  # check_resume has compared the data order
        self.batch_sampler.start_sample = int(state["consumed_samples"])


def _identity(batch):
    return batch


class SinkDataModule(L.LightningDataModule):
    """The prepared dataset, served in a deterministic global order.

    Args:
        path: The prepared dataset directory (`sinklab prep`).
        global_batch_tokens: Tokens per optimizer step over all processes.
        micro_batch_size: Sequences per process per forward.
        token_budget: Train on only this many tokens (Figure 5 right); 0: all.
        val_batches: Validation micro-batches per evaluation.
        num_workers: DataLoader worker processes per rank; 0: load in the training process.
        seed: The seed of the data order and of resampling.
        interventions: The paper's data interventions (section 5, Table 10 right); null: none.
        verify: Check every shard and the probe against the manifest's sha256 before training.
    """

    def __init__(
        self,
        path: str = "data/embedded",
        global_batch_tokens: int = 2**20,
        micro_batch_size: int = 8,
        token_budget: int = 0,
        val_batches: int = 8,
        num_workers: int = 0,
        seed: int = 1234,
        interventions: Interventions | None = None,
        verify: bool = False,
    ):
        super().__init__()
        self.path = Path(path)
        if not (self.path / "manifest.json").is_file():
            raise FileNotFoundError(f"data.path={path}: no manifest.json there; prepare it with `sinklab prep`")
        self.manifest = verify_dataset(self.path) if verify else load_manifest(self.path)
        self.special_ids = self.manifest.special_ids  # role (bos, eos, pad) -> id
        self.global_batch_tokens, self.micro_batch_size = global_batch_tokens, micro_batch_size
        self.token_budget, self.val_batches, self.num_workers, self.seed = token_budget, val_batches, num_workers, seed
        self.interventions = interventions if isinstance(interventions, Interventions) else Interventions()
        self.interventions.validate(self.manifest.context_length, self.special_ids)
        self.plan: BatchPlan | None = None

    def intervene(self) -> Callable[..., np.ndarray]:
        """``apply_interventions`` bound to this run's settings: ``(tokens, samples, epochs[, validation])``."""
        return partial(
            apply_interventions,
            cfg=self.interventions,
            vocab_size=self.manifest.vocab_size,
            seed=self.seed,
            special_ids=self.special_ids,
        )

    def make_plan(self, world_size: int) -> BatchPlan:
        self.plan = plan_batch(
            self.global_batch_tokens, self.manifest.context_length, self.micro_batch_size, world_size
        )
        return self.plan

    def train_dataloader(self) -> StatefulLoader:
        trainer = self.trainer
        plan = self.plan or self.make_plan(trainer.world_size)
        split = PackedSplit(self.path, "train", self.manifest)
        budget = max(1, self.token_budget // self.manifest.context_length) if self.token_budget else None
        dataset = PackedTrainSet(split, GlobalOrder(len(split), self.seed, budget), self.intervene())
        sampler = RankBatchSampler(plan, trainer.global_rank, trainer.max_steps)
        return StatefulLoader(
            dataset,
            sampler,
            lambda: trainer.global_step * plan.global_batch_seqs,
            num_workers=self.num_workers,
            pin_memory=torch.cuda.is_available(),
        )

    def val_dataloader(self) -> DataLoader:
        """The first held-out sequences, with the training interventions applied; the same on every rank."""
        split = PackedSplit(self.path, "val", self.manifest)
        rows = np.arange(min(self.val_batches * self.micro_batch_size, len(split)))
        tokens = self.intervene()(check_token_ids(split.take(rows), split, rows), rows, 0 * rows, validation=True)
        return DataLoader(torch.from_numpy(tokens), batch_size=self.micro_batch_size, num_workers=self.num_workers)

    def order(self) -> dict:
        """What fixes the sequence of training samples (and so what a resume may not change)."""
        return {
            "manifest_hash": self.manifest.hash,
            "seed": self.seed,
            "global_batch_tokens": self.global_batch_tokens,
            "token_budget": self.token_budget,
            "interventions": vars(self.interventions).copy(),
        }

    def state_dict(self) -> dict:
        """Kept in every checkpoint (Lightning stores a data module's state), for the resume check."""
        return {"order": self.order()}

    def probe_tokens(self) -> torch.Tensor:
        """The probe set, carrying the training's fixed token at its position (Table 10 right)."""
        probe = load_probe(self.path)
        if (fix := self.interventions.fix_position) and fix <= probe.shape[1]:
            probe = probe.copy()
            probe[:, fix - 1] = self.interventions.resolve_fix_token(self.special_ids)
        return torch.as_tensor(probe, dtype=torch.long)
