"""Readers: Pile JSON lines (plain and zstd), text files, HF datasets; and their bad inputs."""

from __future__ import annotations

import json

import pytest
import zstandard
from dp_helpers import make_docs, write_jsonl

from data_prep.errors import DataPrepError
from data_prep.readers import (
    ReaderOptions,
    expand_inputs,
    iter_raw_lines,
    read_documents,
    read_hf,
    read_pile,
    read_text,
)


def test_pile_jsonl_and_zst_give_the_same_documents(tmp_path):
    records = make_docs(50, 3)
    plain = list(read_pile(str(write_jsonl(tmp_path / "a.jsonl", records))))
    packed = list(read_pile(str(write_jsonl(tmp_path / "a.jsonl.zst", records, compress=True))))
    assert [(d.text, d.domain, d.line) for d in plain] == [(d.text, d.domain, d.line) for d in packed]
    assert [d.text for d in plain] == [r["text"] for r in records]
    assert [d.domain for d in plain[:3]] == ["A", "B", "A"] and plain[-1].line == 50


def test_zst_reader_streams_across_frames_and_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr("data_prep.readers.COMPRESSED_BLOCK", 64)  # many small reads
    lines = [json.dumps({"text": f"doc {i} " + "x" * (i % 300)}) for i in range(400)]
    frames = [
        zstandard.ZstdCompressor().compress(("\n".join(lines[i : i + 100]) + "\n").encode()) for i in range(0, 400, 100)
    ]
    path = tmp_path / "multi.jsonl.zst"
    path.write_bytes(b"".join(frames))
    assert [line.decode() for line in iter_raw_lines(str(path))] == lines


def test_truncated_zst_is_an_error_naming_the_file(tmp_path):
    path = write_jsonl(tmp_path / "cut.jsonl.zst", make_docs(300, 4), compress=True)
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(DataPrepError, match=r"cut\.jsonl\.zst: truncated zstd stream .*re-create or re-download"):
        list(read_pile(str(path)))


def test_bad_lines_name_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"text": "fine"}, '{"text": "no end'])
    with pytest.raises(DataPrepError, match=r"bad\.jsonl: line 2: not valid JSON .*each line must be one JSON object"):
        list(read_pile(str(path)))
    path = write_jsonl(tmp_path / "notext.jsonl", [{"text": "fine"}, {}, {"body": "x"}])
    with pytest.raises(DataPrepError, match=r"notext\.jsonl: line 2: has no string field 'text'"):
        list(read_pile(str(path)))
    path = write_jsonl(tmp_path / "list.jsonl", ["[1, 2]"])
    with pytest.raises(DataPrepError, match=r"list\.jsonl: line 1: is a JSON list, not an object"):
        list(read_pile(str(path)))


def test_invalid_utf8_is_replaced_and_flagged(tmp_path):
    path = tmp_path / "latin.jsonl"
    path.write_bytes(b'{"text": "caf\xe9 ok"}\n{"text": "fine"}\n')
    docs = list(read_pile(str(path)))
    assert docs[0].text == "caf\ufffd ok" and docs[0].invalid_utf8
    assert docs[1].text == "fine" and not docs[1].invalid_utf8
    assert docs[0].domain == "unknown"  # no meta.pile_set_name


def test_text_units(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("first para\nstill first\n\n\nsecond\n\nthird\n")
    assert [(d.text, d.line) for d in read_text(str(path), "paragraph")] == [
        ("first para\nstill first", 1),
        ("second", 5),
        ("third", 7),
    ]
    assert [d.line for d in read_text(str(path), "line")] == [1, 2, 3, 4, 5, 6, 7]
    (whole,) = read_text(str(path), "file", domain="books")
    assert whole.text == path.read_text() and whole.domain == "books"


def test_expand_inputs_sorts_globs_and_walks_directories(tmp_path):
    for name in ("b.jsonl", "a.jsonl.zst", "skip.csv"):
        (tmp_path / name).write_text("")
    assert [p.rsplit("/", 1)[1] for p in expand_inputs([str(tmp_path / "*.jsonl*")], "pile")] == [
        "a.jsonl.zst",
        "b.jsonl",
    ]
    assert [p.rsplit("/", 1)[1] for p in expand_inputs([str(tmp_path)], "pile")] == ["a.jsonl.zst", "b.jsonl"]
    with pytest.raises(DataPrepError, match=r"nothing\.jsonl: no such file or directory"):
        expand_inputs([str(tmp_path / "nothing.jsonl")], "pile")
    with pytest.raises(DataPrepError, match=r"\*\.txt: matches no input files"):
        expand_inputs([str(tmp_path / "*.txt")], "pile")


def test_hf_dataset_from_save_to_disk_and_from_a_json_file(tmp_path):
    import datasets

    records = make_docs(20, 5)
    rows = {"text": [r["text"] for r in records], "meta": [r["meta"] for r in records]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "saved"))
    saved = list(read_hf(str(tmp_path / "saved")))
    assert [d.text for d in saved] == rows["text"] and [d.domain for d in saved[:2]] == ["A", "B"]
    json_file = write_jsonl(tmp_path / "rows.jsonl", [{"content": r["text"]} for r in records])
    via_options = list(read_documents([str(json_file)], ReaderOptions(fmt="hf", text_field="content", domain="web")))
    assert [d.text for d in via_options] == rows["text"] and {d.domain for d in via_options} == {"web"}
    with pytest.raises(DataPrepError, match=r"rows\.jsonl: row 1: no string field 'text' \(columns: content\)"):
        list(read_hf(str(json_file)))
