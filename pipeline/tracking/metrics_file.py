"""``<run_dir>/metrics.jsonl`` (every metric, one JSON row per call) and ``mlflow_sent``, the byte offset up
to which its rows have reached MLflow (it only moves forward)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from pipeline import metric_names as N
from sinklab_io.atomic import atomic_write


class MetricsFile:
    def __init__(self, run_root: Path):
        self.path = Path(run_root) / "metrics.jsonl"
        self.sent_path = Path(run_root) / "mlflow_sent"

    def append(self, step: int, metrics: dict[str, float]) -> tuple[dict, int]:
        """Append one row; returns it and the byte offset where it ends."""
        row = {"step": step, "time": time.time(), **metrics}
        with open(self.path, "ab") as f:
            f.write((json.dumps(row) + "\n").encode())
            return row, f.tell()

    def last(self, keys) -> dict[str, float | None]:
        """The last value of each key over the whole file (None: never logged)."""
        found: dict[str, float | None] = dict.fromkeys(keys)
        if self.path.is_file():
            for line in self.path.read_text().splitlines():
                row = json.loads(line) if line.strip() else {}
                found |= {k: row[k] for k in keys if k in row}
        return found

    def mark_sent(self, offset: int) -> None:
        atomic_write(self.sent_path, f"{offset}\n")

    def backlog(self, resume_step: int | None) -> tuple[list[dict], int]:
        """The rows past the sent offset that a start resumed at ``resume_step`` will not log again (its
        training metrics from that step on, anything after it), and the offset where the file ends."""
        end = self.path.stat().st_size if self.path.exists() else 0
        try:
            start = int(self.sent_path.read_text())
        except (OSError, ValueError):  # no start has recorded how far it sent: everything counts as sent
            return [], end
        if start >= end or resume_step is None:
            return [], end
        with open(self.path, "rb") as f:
            f.seek(start)
            rows = [json.loads(line) for line in f.read(end - start).splitlines() if line.strip()]
        return [
            {k: v for k, v in row.items() if row["step"] < resume_step or not k.startswith(N.TRAIN)}
            for row in rows
            if row["step"] <= resume_step
        ], end
