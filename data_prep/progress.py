"""A rich progress bar on stderr: input bytes read, tokens packed, throughput."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class PrepProgress:
    def __init__(self, total_bytes: int | None, enabled: bool = True):
        self.enabled = enabled and sys.stderr.isatty()
        self.tokens = 0
        self.start = time.perf_counter()
        self.progress = Progress(
            TextColumn("[bold]prep"),
            BarColumn(),
            DownloadColumn(),
            TextColumn("{task.fields[tokens]:,} tokens ({task.fields[rate]})"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            disable=not self.enabled,
            transient=False,
        )
        self.task = self.progress.add_task("prep", total=total_bytes, tokens=0, rate="-")

    def __enter__(self) -> PrepProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def update(self, bytes_read: int, result: dict[str, Any]) -> None:
        self.tokens += sum(info["document_tokens"] for info in result["splits"].values())
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        self.progress.update(
            self.task, completed=bytes_read, tokens=self.tokens, rate=f"{self.tokens / elapsed / 1e3:,.0f}k tok/s"
        )
