"""Readers: Pile-format JSON lines (`.jsonl`, `.jsonl.zst`), plain text files and Hugging Face
datasets, all behind one interface, an iterator of `Document` in a fixed order.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import zstandard

from data_prep.errors import DataPrepError

FORMATS = ("pile", "text", "hf")
PILE_SUFFIXES = (".jsonl", ".jsonl.zst", ".json", ".json.zst")
TEXT_UNITS = ("file", "paragraph", "line")
COMPRESSED_BLOCK = 1 << 18  # bytes of compressed input per decompression step
MAX_TEXT_FILE_DOCUMENT = 256 << 20
HF_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}  # by suffix
PILE_LINE_HINT = 'each line must be one JSON object like {"text": "...", "meta": {"pile_set_name": "..."}}'


@dataclass
class Document:
    text: str
    domain: str
    line: int  # 1-based line (Pile, text) or row (HF) where the document starts
    invalid_utf8: bool = False  # undecodable bytes were replaced by U+FFFD


@dataclass
class ByteCounter:
    """Bytes consumed from disk so far, for the progress bar."""

    value: int = 0


def expand_inputs(patterns: list[str], fmt: str) -> list[str]:
    """Files (or, for `hf`, dataset references) named by paths, directories and globs."""
    found: list[str] = []
    for pattern in patterns:
        if fmt == "hf":
            found.append(pattern)
            continue
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
        elif os.path.isdir(pattern):
            suffixes = PILE_SUFFIXES if fmt == "pile" else (".txt", ".md", ".text")
            matches = sorted(str(p) for p in Path(pattern).rglob("*") if p.is_file() and str(p).endswith(suffixes))
        elif os.path.isfile(pattern):
            matches = [pattern]
        else:
            raise DataPrepError(f"{pattern}: no such file or directory; --input takes a file, a directory or a glob")
        if not matches:
            raise DataPrepError(f"{pattern}: matches no input files for --format {fmt}")
        found.extend(matches)
    return found


def _decode(raw: bytes) -> tuple[str, bool]:
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        return raw.decode("utf-8", errors="replace"), True


def iter_raw_lines(path: str, counter: ByteCounter | None = None) -> Iterator[bytes]:
    """Lines of a (possibly zstd-compressed) file as bytes without the newline; a truncated `.zst` is an error."""
    compressed = path.endswith(".zst")
    decompressor = zstandard.ZstdDecompressor().decompressobj() if compressed else None
    frame_started = False
    buffer = bytearray()
    lines_out = 0
    with open(path, "rb") as fh:
        while True:
            block = fh.read(COMPRESSED_BLOCK)
            if counter is not None:
                counter.value += len(block)
            if not block:
                break
            if compressed:
                pieces = []
                while block:
                    try:
                        pieces.append(decompressor.decompress(block))
                    except zstandard.ZstdError as exc:
                        raise DataPrepError(
                            f"{path}: corrupt zstd data after line {lines_out} ({exc}); re-create or re-download the shard"
                        ) from None
                    frame_started = True
                    if decompressor.eof:  # a frame ended; the rest of the block starts the next one
                        block = decompressor.unused_data
                        decompressor = zstandard.ZstdDecompressor().decompressobj()
                        frame_started = False
                    else:
                        block = b""
                block = b"".join(pieces)
            buffer += block
            end = buffer.rfind(b"\n")
            if end >= 0:
                lines = bytes(buffer[:end]).split(b"\n")
                del buffer[: end + 1]
                lines_out += len(lines)
                yield from lines
    if compressed and frame_started:
        raise DataPrepError(
            f"{path}: truncated zstd stream (the file ends inside a compressed frame, after line {lines_out}); "
            "re-create or re-download the shard"
        )
    if buffer:
        yield bytes(buffer)


def read_pile(path: str, default_domain: str = "unknown", counter: ByteCounter | None = None) -> Iterator[Document]:
    """Documents of one Pile-format shard: `{"text": str, "meta": {"pile_set_name": str}}` per line."""
    for line_no, raw in enumerate(iter_raw_lines(path, counter), 1):
        if not raw.strip():
            continue
        text, invalid = _decode(raw)
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataPrepError(
                f"{path}: line {line_no}: not valid JSON ({exc.msg} at column {exc.colno}); {PILE_LINE_HINT}"
            ) from None
        if not isinstance(obj, dict):
            raise DataPrepError(
                f"{path}: line {line_no}: is a JSON {type(obj).__name__}, not an object; {PILE_LINE_HINT}"
            )
        if not isinstance(obj.get("text"), str):
            raise DataPrepError(f"{path}: line {line_no}: has no string field 'text'; {PILE_LINE_HINT}")
        meta = obj.get("meta")
        domain = meta.get("pile_set_name") if isinstance(meta, dict) else None
        yield Document(obj["text"], str(domain) if domain else default_domain, line_no, invalid)


def read_text(
    path: str, unit: str = "file", domain: str = "text", counter: ByteCounter | None = None
) -> Iterator[Document]:
    """Documents of a plain text file: the whole file, each blank-line separated paragraph, or each line."""
    if unit == "file":
        size = os.path.getsize(path)
        if size > MAX_TEXT_FILE_DOCUMENT:
            raise DataPrepError(
                f"{path}: {size} bytes is too large for one document; use --text-unit paragraph or line"
            )
        raw = Path(path).read_bytes()
        if counter is not None:
            counter.value += len(raw)
        text, invalid = _decode(raw)
        yield Document(text, domain, 1, invalid)
        return
    numbered = enumerate(iter_raw_lines(path, counter), 1)
    if unit == "line":
        for line_no, raw in numbered:
            text, invalid = _decode(raw)
            yield Document(text, domain, line_no, invalid)
        return
    for has_text, run in itertools.groupby(numbered, key=lambda item: bool(item[1].strip())):
        if has_text:
            paragraph = list(run)
            text, invalid = _decode(b"\n".join(raw for _, raw in paragraph))
            yield Document(text, domain, paragraph[0][0], invalid)


def _open_hf(ref: str, split: str):
    import datasets  # heavy; imported only for --format hf

    path = Path(ref)
    if path.is_dir() and any((path / f).exists() for f in ("dataset_info.json", "state.json", "dataset_dict.json")):
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise DataPrepError(f"{ref}: no split {split!r}; it has: {', '.join(ds)} (choose with --hf-split)")
            ds = ds[split]
        return ds
    if path.is_file():
        builder = HF_BUILDERS.get(path.suffix)
        if builder is None:
            raise DataPrepError(
                f"{ref}: cannot tell the file type; a local file for --format hf ends in .json, .jsonl, .csv, .parquet or .txt"
            )
        return datasets.load_dataset(builder, data_files=str(path), split="train", streaming=True)
    try:
        return datasets.load_dataset(ref, split=split, streaming=True)
    except Exception as exc:  # datasets raises many types; the message is what matters
        raise DataPrepError(f"{ref}: cannot open as a Hugging Face dataset ({type(exc).__name__}: {exc})") from None


def read_hf(ref: str, split: str = "train", text_field: str = "text", domain: str | None = None) -> Iterator[Document]:
    """Rows of a Hugging Face dataset; the domain is `meta.pile_set_name`, else `domain` or the dataset's name."""
    ds = _open_hf(ref, split)
    fallback = domain or Path(ref.rstrip("/")).name
    for row_no, row in enumerate(ds, 1):
        text = row.get(text_field)
        if not isinstance(text, str):
            raise DataPrepError(
                f"{ref}: row {row_no}: no string field {text_field!r} (columns: {', '.join(row)}); choose one with --text-field"
            )
        meta = row.get("meta")
        if isinstance(meta, str):
            try:
                meta = json.loads(meta)
            except json.JSONDecodeError:
                meta = None
        name = meta.get("pile_set_name") if isinstance(meta, dict) else None
        yield Document(text, str(name) if name else fallback, row_no)


@dataclass(frozen=True)
class ReaderOptions:
    fmt: str = "pile"
    text_unit: str = "file"
    domain: str | None = None  # domain of documents without meta.pile_set_name
    text_field: str = "text"
    hf_split: str = "train"


def read_documents(inputs: list[str], options: ReaderOptions, counter: ByteCounter | None = None) -> Iterator[Document]:
    """All documents of the inputs (already expanded), in order."""
    for ref in inputs:
        if options.fmt == "pile":
            yield from read_pile(ref, options.domain or "unknown", counter)
        elif options.fmt == "text":
            yield from read_text(ref, options.text_unit, options.domain or "text", counter)
        elif options.fmt == "hf":
            yield from read_hf(ref, options.hf_split, options.text_field, options.domain)
        else:
            raise DataPrepError(f"--format {options.fmt!r} is unknown; choose one of {', '.join(FORMATS)}")
