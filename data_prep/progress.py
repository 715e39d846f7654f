"""A rich progress bar on stderr: input bytes read, tokens packed, throughput."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class PrepProgress(Progress):
    def __init__(self, total_bytes: int | None, enabled: bool = True):
        super().__init__(
            TextColumn("[bold]prep"),
            BarColumn(),
            DownloadColumn(),
            TextColumn("{task.fields[tokens]:,} tokens ({task.fields[rate]})"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            disable=not (enabled and sys.stderr.isatty()),
            transient=False,
        )
        self.tokens = 0
        self.began = time.perf_counter()
        self.task = self.add_task("prep", total=total_bytes, tokens=0, rate="-")

    def record(self, bytes_read: int, result: dict[str, Any]) -> None:
        """One packed chunk's tokens, and the input read so far."""
        self.tokens += sum(info["document_tokens"] for info in result["splits"].values())
        elapsed = max(time.perf_counter() - self.began, 1e-9)
        rate = f"{self.tokens / elapsed / 1e3:,.0f}k tok/s"
        self.update(self.task, completed=bytes_read, tokens=self.tokens, rate=rate)
