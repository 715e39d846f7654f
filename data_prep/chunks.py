"""Group a document stream into chunks (the unit of parallel work and of resumption), counting what is skipped."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from data_prep.pack import ChunkTask
from data_prep.readers import ByteCounter, ReaderOptions, read_documents


@dataclass
class Chunk:
    task: ChunkTask
    # documents_read, empty_documents, invalid_utf8_documents, filtered_documents
    counts: Counter = field(default_factory=Counter)
    text_chars: int = 0


def iter_chunks(
    stream: str,
    inputs: list[str],
    options: ReaderOptions,
    chunk_chars: int,
    domains: frozenset[str] | None = None,
    counter: ByteCounter | None = None,
    seen_domains: set[str] | None = None,
) -> Iterator[Chunk]:
    """Chunks of at least `chunk_chars` characters of kept documents (the last may be smaller)."""
    chunk = Chunk(ChunkTask(stream, 0, [], []))
    for doc in read_documents(inputs, options, counter):
        chunk.counts["documents_read"] += 1
        if seen_domains is not None:
            seen_domains.add(doc.domain)
        if domains is not None and doc.domain not in domains:
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
        if chunk.text_chars >= chunk_chars:
            yield chunk
            chunk = Chunk(ChunkTask(stream, chunk.task.index + 1, [], []))
    if chunk.task.texts or chunk.counts:
        yield chunk
