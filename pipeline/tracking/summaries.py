"""One training run as a report reads it, and which run of a variant's seed a report shows; standard library
only, so a report rendered from a data file loads no MLflow."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from .contract import FINISHED

# params that name one run rather than its config: left out of the config hash
RUN_PARAMS = ("seed_everything", "data.seed", "run.name", "run_dir", "resume")


@dataclass
class RunSummary:
    """One training run of a variant as MLflow reports it."""

    run_id: str
    variant: str
    status: str  # sinklab.status tag, else MLflow's own status in lower case
    start_time: int  # ms since the epoch
    metrics: dict[str, float] = field(default_factory=dict)
    seed: int | None = None  # the sinklab.seed tag
    commit: str | None = None  # the sinklab.code_version tag
    config_hash: str | None = None  # :func:`config_hash` of its params
    steps: int | None = None  # the last step it logged a loss or the sink probe at
    memorising: str | None = None  # the warning where its valid loss turned upward for good

    @property
    def finished(self) -> bool:
        return self.status == FINISHED


def config_hash(params: dict[str, str]) -> str | None:
    """sha256 (12 hex digits) of a run's logged config less :data:`RUN_PARAMS`; None where it logged none."""
    kept = {k: v for k, v in params.items() if k not in RUN_PARAMS}
    if not kept:
        return None
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:12]


def best_runs(runs: list[RunSummary]) -> dict[int | None, RunSummary]:
    """The run a report shows for each seed of a variant (its newest finished, else its newest), in seed order."""
    by_seed: dict[int | None, list[RunSummary]] = {}
    for run in runs:
        by_seed.setdefault(run.seed, []).append(run)
    shown = {seed: next((r for r in seeded if r.finished), seeded[0]) for seed, seeded in by_seed.items()}
    return {seed: shown[seed] for seed in sorted(shown, key=lambda s: (s is None, s or 0))}
