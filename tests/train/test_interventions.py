"""pipeline/train/interventions.py: resampled and fixed tokens at chosen positions, deterministic
per sequence and epoch; a bad field is named."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.model.config import ConfigError
from pipeline.train.interventions import Interventions, apply_interventions

SPECIAL = {"bos": 1, "eos": 2, "pad": 0}


def test_resample_positions_uniform_and_deterministic():
    V, B = 64, 4000
    tokens = np.full((B, 6), 5, dtype=np.int64)
    ids, epochs = np.arange(B), np.zeros(B, dtype=np.int64)
    cfg = Interventions(resample=[1, 2])
    out = apply_interventions(tokens, ids, epochs, cfg, V, seed=0, special_ids=SPECIAL)
    assert (out[:, 2:] == 5).all() and (tokens == 5).all()
    again = apply_interventions(tokens[:200], ids[:200], epochs[:200], cfg, V, seed=0, special_ids=SPECIAL)
    assert np.array_equal(out[:200], again)
    other_epoch = apply_interventions(tokens[:200], ids[:200], epochs[:200] + 1, cfg, V, seed=0, special_ids=SPECIAL)
    assert (other_epoch[:, :2] != out[:200, :2]).mean() > 0.9
    for col in (0, 1):
        counts = np.bincount(out[:, col], minlength=V)
        chi2 = ((counts - B / V) ** 2 / (B / V)).sum()
        assert chi2 < 110, chi2  # 63 degrees of freedom: p < 0.001 beyond ~103
    assert np.corrcoef(out[:, 0], out[:, 1])[0, 1] < 0.05


@pytest.mark.parametrize("position", [1, 2, 3])
def test_fix_token_at_a_position(position):
    tokens = np.arange(40, dtype=np.int64).reshape(4, 10)
    cfg = Interventions(fix_position=position, fix_token="bos")
    cfg.validate(10, SPECIAL)
    out = apply_interventions(tokens, np.arange(4), np.zeros(4, int), cfg, 64, 0, SPECIAL)
    assert (out[:, position - 1] == 1).all()
    keep = [c for c in range(10) if c != position - 1]
    assert np.array_equal(out[:, keep], tokens[:, keep])


def test_bad_intervention_names_the_field():
    with pytest.raises(ConfigError, match="fix_token='cls'.*bos"):
        Interventions(fix_position=1, fix_token="cls").validate(10, SPECIAL)
    with pytest.raises(ConfigError, match="resample: position 11"):
        Interventions(resample=[11]).validate(10, SPECIAL)
