"""Group a document stream into chunks (the unit of parallel work and of resumption), run them through N worker
processes with bounded look-ahead, account for them in input order (so the token budget cuts at the same place
however many workers run), reuse the done markers of an interrupted run, and show a progress bar on stderr."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import sys
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from data_prep.pack import ChunkTask, PackConfig, init_worker, marker_file, process_chunk
from data_prep.readers import ReaderOptions, read_documents

if TYPE_CHECKING:
    from data_prep.prepare import Preparation


@dataclass
class Chunk:
    task: ChunkTask
    counts: Counter = field(default_factory=Counter)  # of manifest.DOCUMENT_COUNTS
    text_chars: int = 0


def iter_chunks(prep: Preparation, stream: str, inputs: list[str], options: ReaderOptions) -> Iterator[Chunk]:
    """Chunks of at least `chunk_chars` characters of kept documents (the last may be smaller)."""
    chunk = Chunk(ChunkTask(stream, 0, [], []))
    for doc in read_documents(inputs, options, prep.counter):
        chunk.counts["documents_read"] += 1
        prep.seen_domains.add(doc.domain)
        if prep.cfg.domains and doc.domain not in prep.cfg.domains:
            chunk.counts["filtered_documents"] += 1
            continue
        if not doc.text.strip():
            chunk.counts["empty_documents"] += 1
            continue
        if doc.invalid_utf8:
            chunk.counts["invalid_utf8_documents"] += 1
        chunk.task.texts.append(doc.text)
        chunk.task.domains.append(doc.domain)
        chunk.text_chars += len(doc.text)
        if chunk.text_chars >= prep.cfg.chunk_chars:
            yield chunk
            chunk = Chunk(ChunkTask(stream, chunk.task.index + 1, [], []))
    if chunk.task.texts or chunk.counts:
        yield chunk


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
        self.task = self.add_task("prep", total=total_bytes, tokens=0, rate="-")

    def record(self, bytes_read: int, result: dict[str, Any]) -> None:
        """One packed chunk's tokens, and the input read so far."""
        self.tokens += sum(info["document_tokens"] for info in result["splits"].values())
        elapsed = max(self.tasks[0].elapsed or 0, 1e-9)
        rate = f"{self.tokens / elapsed / 1e3:,.0f}k tok/s"
        self.update(self.task, completed=bytes_read, tokens=self.tokens, rate=rate)


class ChunkRunner:
    def __init__(self, prep: Preparation, pack_config: PackConfig):
        self.prep = prep
        self.pack_config = pack_config
        cfg = prep.cfg
        self.budget = cfg.max_tokens // cfg.context_length if cfg.max_tokens else None  # train sequences
        self.look_ahead = 2 * cfg.workers  # chunks read ahead of the oldest unfinished one
        self.used: list[tuple[Chunk, dict[str, Any]]] = []
        self.train_sequences = self.tokenized = self.resumed = 0

    def run(self) -> None:
        cfg = self.prep.cfg
        total_bytes = sum(e["bytes"] or 0 for e in self.prep.spec["inputs"] + self.prep.spec["val_inputs"]) or None
        # spawn: no inherited tokenizer threads; an executor, unlike a Pool, fails fast when a worker dies
        self.executor = ProcessPoolExecutor(
            cfg.workers, multiprocessing.get_context("spawn"), init_worker, (self.pack_config,)
        )
        try:
            with PrepProgress(total_bytes, enabled=cfg.progress) as self.progress:
                for stream, inputs, options in self.prep.streams():
                    self._run_stream(iter_chunks(self.prep, stream, inputs, options))
        finally:  # chunks read ahead of a reached budget are not packed
            self.executor.shutdown(wait=True, cancel_futures=True)

    def _run_stream(self, chunks) -> None:
        pending: deque[tuple[Chunk, Future]] = deque()  # a resumed chunk's result is a finished Future
        for chunk in itertools.chain(chunks, [None]):  # None: the stream ended, all pending are consumed
            if chunk is not None and (marker := marker_file(self.prep.staging, chunk.task.name)).is_file():
                pending.append((chunk, Future()))
                pending[-1][1].set_result(json.loads(marker.read_text(encoding="utf-8")))
                self.resumed += 1
            elif chunk is not None:
                pending.append((chunk, self.executor.submit(process_chunk, chunk.task)))
                self.tokenized += 1
            while pending and (chunk is None or len(pending) > self.look_ahead or pending[0][1].done()):
                oldest, future = pending.popleft()
                if self._consume(oldest, future.result()):
                    return  # budget reached: chunks read ahead are dropped

    def _consume(self, chunk: Chunk, result: dict[str, Any]) -> bool:
        """Account one chunk, in input order; True when the token budget is reached."""
        stop = False
        if chunk.task.stream == "main" and self.budget is not None:
            remaining = self.budget - self.train_sequences
            full, limit = result["splits"]["train"]["sequences"], result["limit"]
            if (full > remaining) if limit is None else (limit != remaining):
                # The budget ends inside this chunk: pack only the documents it needs.
                result = self.executor.submit(process_chunk, replace(chunk.task, limit=remaining)).result()
                self.tokenized += 1
            stop = result["limit"] is not None or full == remaining
        self.train_sequences += result["splits"]["train"]["sequences"]
        self.prep.probe_pool.add(result.get("probe_candidates", []))
        self.used.append((chunk, {k: v for k, v in result.items() if k != "probe_candidates"}))
        chunk.task.texts, chunk.task.domains = [], []  # memory must not grow with the corpus
        self.progress.record(self.prep.counter.value, result)
        return stop
