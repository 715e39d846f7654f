"""Fixtures of the cluster tests: a real SLURM started for the session (root only)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster, ensure_installed


@pytest.fixture(scope="session")
def slurm():
    """A running two-node SLURM on this machine; skipped (with the reason) where it cannot run."""
    if os.geteuid() != 0:
        pytest.skip("starting SLURM daemons (slurmctld, slurmd, munged) needs root")
    why_not = ensure_installed()
    if why_not:
        pytest.skip(why_not)
    # A directory of its own, not pytest's numbered temp dirs (which other pytest sessions on the
    # same machine may rotate away while the daemons still use it).
    cluster = SlurmCluster(Path(tempfile.mkdtemp(prefix="sinklab-slurm-")))
    with pytest.MonkeyPatch.context() as patch:
        # sbatch, scontrol and the jobs (which inherit this environment) find the test cluster.
        patch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
        patch.setenv("MASTER_ADDR", cluster.env["MASTER_ADDR"])
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()
            shutil.rmtree(cluster.root, ignore_errors=True)
