"""The paper's data interventions (section 5, Table 10 right), applied when a batch is formed; positions
are 1-based (x_1 is a chunk's first token), each resampled row draws from its own (seed, epoch, sample) stream."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.model.config import ConfigError


@dataclass
class Interventions:
    """The paper's data interventions, applied when a batch is formed."""

    resample: list[int] = field(default_factory=list)
    """1-based positions whose tokens are drawn at random."""
    fix_position: int = 0
    """A 1-based position that holds fix_token in every chunk; 0: none."""
    fix_token: int | str | None = None
    """The token at fix_position: an id, or a special token's name (bos, eos)."""

    def validate(self, context_length: int, special_ids: dict[str, int]) -> None:
        for p in self.resample:
            if not 1 <= p <= context_length:
                raise ConfigError(f"data.interventions.resample: position {p} outside 1..{context_length}")
        if self.fix_position:
            if not 1 <= self.fix_position <= context_length:
                raise ConfigError(f"data.interventions.fix_position={self.fix_position}: outside 1..{context_length}")
            if self.fix_token is None:
                raise ConfigError(
                    "data.interventions.fix_position is set but fix_token is not "
                    f"(a token id or one of {sorted(special_ids)})"
                )
            self.resolve_fix_token(special_ids)
            if self.fix_position in self.resample:
                raise ConfigError(f"data.interventions: position {self.fix_position} is both fixed and resampled")

    def resolve_fix_token(self, special_ids: dict[str, int]) -> int:
        token = self.fix_token
        if isinstance(token, str) and not token.isdigit():
            if (key := token.lower()) not in special_ids:
                raise ConfigError(
                    f"data.interventions.fix_token={token!r}: the dataset's special tokens are "
                    f"{sorted(special_ids)}; or give a token id"
                )
            return int(special_ids[key])
        return int(token)


def apply_interventions(
    tokens: np.ndarray,
    sample_ids: np.ndarray,
    epoch_ids: np.ndarray,
    cfg: Interventions,
    vocab_size: int,
    seed: int,
    special_ids: dict[str, int],
    validation: bool = False,
) -> np.ndarray:
    """tokens [B, C] int64 (modified copy); sample_ids / epoch_ids [B] identify each row.
    ``validation``: rows of the held-out split, changed the same way from a separate stream."""
    if not (cfg.resample or cfg.fix_position):
        return tokens
    out = tokens.copy()
    if cfg.resample:
        cols = np.asarray(cfg.resample) - 1
        for row, (sample, epoch) in enumerate(zip(sample_ids, epoch_ids)):
            # a validation row draws from a random stream of its own, never a training row's
            key = [seed, 0x5EED, int(epoch), int(sample)] + ([1] if validation else [])
            out[row, cols] = np.random.default_rng(key).integers(0, vocab_size, size=len(cols))
    if cfg.fix_position:
        out[:, cfg.fix_position - 1] = cfg.resolve_fix_token(special_ids)
    return out
