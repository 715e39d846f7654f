"""Paper experiments: experiment files, sweeps and reports."""
