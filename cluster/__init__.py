"""Cluster: render and submit SLURM jobs and sweeps that call the `sinklab` command."""
