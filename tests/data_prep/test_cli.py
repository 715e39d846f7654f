"""`sinklab prep` from the command line: bad inputs give one clear line and exit 2 leaving no
output; the embedded preset runs end to end."""

from __future__ import annotations

import json
import time

import pytest
from dp_helpers import make_docs, write_jsonl
from tokenizers import Tokenizer, models, pre_tokenizers

from data_prep.cli import main
from data_prep.dataset import PackedSplit, load_manifest, load_probe
from data_prep.readers import read_pile


def prep(args, tokenizer=None) -> list[str]:
    base = [
        "--context-length",
        "32",
        "--probe-sequences",
        "5",
        "--probe-length",
        "8",
        "--workers",
        "1",
        "--no-progress",
    ]
    return args + base + (["--tokenizer", str(tokenizer)] if tokenizer else [])


def error_of(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sinklab prep: error: ")
    return err[0]


def test_truncated_zst_leaves_no_output(tmp_path, capsys, tokenizer_file):
    bad = write_jsonl(tmp_path / "cut.jsonl.zst", make_docs(2000, 1), compress=True)
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    out = tmp_path / "ds"
    line = error_of(capsys, prep(["--input", str(bad), "--out", str(out)], tokenizer_file))
    assert f"{bad}: truncated zstd stream" in line and "re-create or re-download" in line
    assert not out.exists()


@pytest.mark.parametrize(
    "lines, expected",
    [
        (
            ['{"text": "a b c"}', "not json"],
            "line 302: not valid JSON (Expecting value at column 1); each line must be",
        ),
        (['{"text": "a b c"}', '{"meta": {}}'], "line 302: has no string field 'text'; each line must be"),
    ],
)
def test_bad_lines_leave_no_output(tmp_path, capsys, tokenizer_file, lines, expected):
    good = [json.dumps(d) for d in make_docs(300, 3)]
    bad = write_jsonl(tmp_path / "bad.jsonl", good + lines)
    out = tmp_path / "ds"
    out.mkdir()  # an existing empty directory stays, empty
    line = error_of(capsys, prep(["--input", str(bad), "--val-fraction", "0.2", "--out", str(out)], tokenizer_file))
    assert f"{bad}: {expected}" in line
    assert list(out.iterdir()) == []


def test_invalid_utf8_and_empty_documents_are_counted(tmp_path, capsys, tokenizer_file):
    good = [json.dumps(d) for d in make_docs(300, 4)]
    path = tmp_path / "mixed.jsonl"
    extra = [
        b'{"text": "caf\xe9 au lait"}',
        b'{"text": ""}',
        b'{"text": "   \\n  "}',
        b'{"text": "lone \\ud800 surrogate"}',
    ]
    path.write_bytes(b"\n".join([g.encode() for g in good] + extra) + b"\n")
    out = tmp_path / "ds"
    assert main(prep(["--input", str(path), "--val-fraction", "0.2", "--out", str(out)], tokenizer_file)) == 0
    printed = capsys.readouterr().out
    assert "empty skipped 2  invalid UTF-8 replaced 2" in printed
    docs = json.loads((out / "manifest.json").read_text())["documents"]
    assert docs == {"documents_read": 304, "empty_documents": 2, "invalid_utf8_documents": 2, "filtered_documents": 0}


def test_output_dir_with_another_dataset_is_refused(tmp_path, capsys, tokenizer_file):
    data = write_jsonl(tmp_path / "d.jsonl", make_docs(300, 5))
    out = tmp_path / "ds"
    assert main(prep(["--input", str(data), "--val-fraction", "0.2", "--out", str(out)], tokenizer_file)) == 0
    before = (out / "manifest.json").read_bytes()
    line = error_of(capsys, prep(["--input", str(data), "--val-fraction", "0.3", "--out", str(out)], tokenizer_file))
    assert f"{out}: already holds a different dataset (val_fraction: 0.2 there, 0.3 here)" in line
    assert (out / "manifest.json").read_bytes() == before


def test_forced_uint16_with_a_large_vocabulary_is_refused(tmp_path, capsys):
    vocab = {f"w{i}": i for i in range(70_000)} | {"<|eos|>": 70_000, "[UNK]": 70_001}
    big = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    big.pre_tokenizer = pre_tokenizers.Whitespace()
    big.save(str(tmp_path / "big.json"))
    data = write_jsonl(tmp_path / "d.jsonl", make_docs(50, 6))
    out = tmp_path / "ds"
    line = error_of(capsys, prep(["--input", str(data), "--out", str(out), "--dtype", "uint16"], tmp_path / "big.json"))
    assert (
        line
        == "sinklab prep: error: --dtype uint16 holds ids below 65536 but the tokenizer has 70002 ids; use --dtype uint32 "
        f"or leave --dtype out; removed {out}, which this run had created"
    )
    assert not out.exists()


def test_missing_input_and_unknown_tokenizer(tmp_path, capsys):
    line = error_of(capsys, prep(["--input", str(tmp_path / "none.jsonl.zst"), "--out", str(tmp_path / "ds")]))
    assert "none.jsonl.zst: no such file or directory" in line
    data = write_jsonl(tmp_path / "d.jsonl", make_docs(5, 7))
    line = error_of(capsys, prep(["--input", str(data), "--out", str(tmp_path / "ds")], tmp_path / "nope"))
    assert "nope: no tokenizer.json there" in line


@pytest.mark.parametrize("garbage", [b"\xff\xfe garbage", b"[1, 2]", b'{"model": 3}'])
def test_a_garbage_tokenizer_file_is_one_line(garbage, tmp_path, capsys):
    """A tokenizer.json of garbage bytes: one line, no traceback."""
    (tmp_path / "tokenizer.json").write_bytes(garbage)
    data = write_jsonl(tmp_path / "d.jsonl", make_docs(5, 7))
    line = error_of(capsys, prep(["--input", str(data), "--out", str(tmp_path / "ds")], tmp_path / "tokenizer.json"))
    assert f"{tmp_path / 'tokenizer.json'}: not a valid HF tokenizers file (" in line
    assert not (tmp_path / "ds").exists()


def test_a_bb_probe_longer_than_the_context_is_refused(tmp_path, capsys):
    """Refused at prep time: a fit on it could not run."""
    out = tmp_path / "bb"
    line = error_of(capsys, ["bb", "--out", str(out), "--context-length", "16", "--probe-length", "32"])
    assert "--probe-length 32: longer than --context-length 16, which a model trained on it cannot read" in line
    assert not out.exists()


def test_embedded_preset_end_to_end(tmp_path, capsys):
    out = tmp_path / "embedded"
    argv = [
        "embedded",
        "--out",
        str(out),
        "--domain-chars",
        "200k",
        "--vocab-size",
        "400",
        "--probe-sequences",
        "20",
        "--workers",
        "1",
        "--no-progress",
    ]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "Shakespeare" in first and "Python-stdlib" in first and "(already prepared" not in first
    # the raw corpus is Pile format: the same reader reads it
    raw = list(read_pile(str(out / "raw" / "val.jsonl.zst"))) + list(
        read_pile(str(out / "raw" / "train" / "00.jsonl.zst"))
    )
    assert {d.domain for d in raw} == {"Shakespeare", "Python-stdlib"}
    assert any(d.text.startswith("A Midsummer Night's Dream\nACT I\nSCENE") for d in raw)
    m = load_manifest(out)
    assert (m.context_length, m.vocab_size, m.bos, m.bos_id, m.dtype) == (128, 400, True, 0, "uint16")
    assert set(m.splits["train"].domains) == {"Shakespeare", "Python-stdlib"}
    train = PackedSplit(out, "train")
    assert train[0][0] == 0  # the first sequence starts a document with BOS
    assert load_probe(out).shape == (20, 64) and not (load_probe(out) == 0).any()
    tokenizer_hash = m.raw["tokenizer"]["sha256"]

    start = time.perf_counter()
    assert main(argv) == 0
    assert time.perf_counter() - start < 5
    assert "(already prepared; nothing to do)" in capsys.readouterr().out
    assert load_manifest(out).hash == m.hash

    # the BPE training is deterministic: a fresh directory gives the same tokenizer and data
    again = tmp_path / "again"
    assert main([a if a != str(out) else str(again) for a in argv]) == 0
    assert load_manifest(again).raw["tokenizer"]["sha256"] == tokenizer_hash
    assert load_manifest(again).hash == m.hash


def test_text_files_through_the_cli(tmp_path, capsys, tokenizer_file):
    docs = [d["text"] for d in make_docs(200, 8)]
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "a.txt").write_text("\n\n".join(docs[:100]) + "\n")
    (tmp_path / "books" / "b.txt").write_text("\n\n".join(docs[100:]) + "\n")
    out = tmp_path / "ds"
    argv = [
        "--input",
        str(tmp_path / "books"),
        "--format",
        "text",
        "--text-unit",
        "paragraph",
        "--domain",
        "books",
        "--val-fraction",
        "0.25",
    ]
    assert main(prep(argv + ["--out", str(out)], tokenizer_file)) == 0
    m = load_manifest(out)
    assert m.splits["train"].documents + m.splits["val"].documents == 200
    assert set(m.splits["train"].domains) == {"books"} and m.raw["documents"]["documents_read"] == 200


# ---- --out that cannot hold a dataset, and Ctrl-C -----------------------------------------------
@pytest.mark.parametrize(
    "out, message",
    [
        ("/proc/sinklab-x", "--out /proc/sinklab-x: cannot create it ("),
        ("{file}/ds", "/ds: cannot create it (Not a directory)"),
        ("{file}", "is a file; choose a directory path"),
        ("{notes}", "holds notes.txt, which is not part of a SinkLab dataset; choose an empty or new directory"),
    ],
)
def test_output_that_cannot_hold_a_dataset_is_refused(out, message, tmp_path, capsys, tokenizer_file):
    data = write_jsonl(tmp_path / "d.jsonl", make_docs(300, 5))
    (tmp_path / "afile").write_text("x")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's own")
    out = out.replace("{file}", str(tmp_path / "afile")).replace("{notes}", str(tmp_path / "mine"))
    line = error_of(capsys, prep(["--input", str(data), "--val-fraction", "0.2", "--out", out], tokenizer_file))
    assert message in line
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]


def test_ctrl_c_exits_130_and_the_rerun_resumes_to_the_same_bytes(tmp_path, tokenizer_file):
    import os
    import signal
    import subprocess
    import sys

    data = write_jsonl(tmp_path / "d.jsonl", make_docs(6000, 7))
    args = prep(["--input", str(data), "--val-fraction", "0.1", "--chunk-chars", "2k"], tokenizer_file)
    cmd = [sys.executable, "-m", "pipeline.cli", "prep", *args]
    proc = subprocess.Popen(
        [*cmd, "--out", str(tmp_path / "cut")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    done = tmp_path / "cut" / ".partial" / "done"
    deadline = time.time() + 60
    while proc.poll() is None and time.time() < deadline and not (done.is_dir() and any(done.iterdir())):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert out.strip().splitlines()[-1].startswith("sinklab prep: interrupted; run the same command again")
    assert "Traceback" not in out
    assert not (tmp_path / "cut" / "manifest.json").exists()
    assert main([*args, "--out", str(tmp_path / "cut")]) == 0
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    assert load_manifest(tmp_path / "cut").hash == load_manifest(tmp_path / "whole").hash  # the command differs
    for name in ("train/00000.bin", "val/00000.bin", "probe.bin", "tokenizer.json"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


def test_a_vocabulary_no_bpe_can_use_is_refused_and_the_rerun_is_not_blocked(tmp_path, capsys, corpus):
    """--vocab-size 1e10 (the tokenizer trainer would ask for 566 GB) is refused, and leaves no
    .partial to block the corrected re-run."""
    out = tmp_path / "ds"
    args = prep(["--input", str(corpus["train"]), "--val-input", str(corpus["val"]), "--out", str(out)])
    line = error_of(capsys, [*args, "--vocab-size", "10000000000"])
    assert "--vocab-size 10,000,000,000 is more than a trained BPE can use; give at most 1,048,576" in line
    assert not out.exists()
    # what an aborted process leaves: the staging folder of other settings, before any work was done
    (out / ".partial").mkdir(parents=True)
    (out / ".partial" / "spec.json").write_text(json.dumps({"tokenizer": {"train_vocab_size": 10**10}}))
    assert main([*args, "--vocab-size", "400"]) == 0
    assert load_manifest(out).vocab_size <= 400 and not (out / ".partial").exists()


def test_a_vocabulary_larger_than_the_corpus_supports_is_a_warning(tmp_path, capsys, corpus):
    out = tmp_path / "ds"
    assert (
        main(
            prep(
                [
                    "--input",
                    str(corpus["train"]),
                    "--val-input",
                    str(corpus["val"]),
                    "--out",
                    str(out),
                    "--vocab-size",
                    "70000",
                ]
            )
        )
        == 0
    )
    got = load_manifest(out).vocab_size
    warning = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert got < 70000 and warning == [
        f"sinklab prep: warning: --vocab-size 70,000: the corpus supports only {got:,} ids "
        f"(the tokenizer found nothing more to merge); the dataset has {got:,}"
    ]


def test_a_file_size_limit_is_one_line_leaves_nothing_and_the_rerun_finishes(tmp_path, corpus, tokenizer_file):
    """EFBIG (or a full disk) while shards are written: one line naming the folder, exit 2, the
    folder this run created removed; the run without the limit finishes."""
    import resource
    import subprocess
    import sys

    out = tmp_path / "ds"
    argv = [
        sys.executable,
        "-m",
        "pipeline.cli",
        "prep",
        *prep(["--input", str(corpus["train"]), "--val-input", str(corpus["val"]), "--out", str(out)], tokenizer_file),
    ]
    limited = subprocess.run(
        argv, capture_output=True, text=True, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))
    )
    err = limited.stderr.strip().splitlines()
    assert limited.returncode == 2 and len(err) == 1, limited.stderr
    assert f"writing {out}: File too large" in err[0] and "ulimit -f" in err[0], err[0]
    assert f"removed {out}, which this run had created" in err[0] and not out.exists()
    assert subprocess.run(argv, capture_output=True, text=True).returncode == 0
    assert load_manifest(out).splits["train"].tokens > 0


def test_a_full_disk_removes_what_this_run_wrote_and_nothing_else(
    tmp_path, capsys, monkeypatch, corpus, tokenizer_file
):
    """A prep that hits a full disk leaves no half-written dataset folder. A failure removes
    what that invocation added: a folder it created (with its new parents), or the new entries of a
    folder that stood before; what an interrupted run staged there is kept, and resumed from."""
    import errno
    import os

    from data_prep.runner import ChunkRunner

    consume = ChunkRunner._consume

    def fail_after(n: int, exc: BaseException) -> None:
        calls = []

        def patched(self, chunk, result):
            calls.append(chunk)
            if len(calls) > n:
                raise exc
            return consume(self, chunk, result)

        monkeypatch.setattr(ChunkRunner, "_consume", patched)

    def full(out):
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / ".partial" / "shards" / "x.bin"))

    def files(folder):
        return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}

    def argv(out):
        inputs = ["--input", str(corpus["train"]), "--val-input", str(corpus["val"])]
        return prep([*inputs, "--chunk-chars", "4k", "--out", str(out)], tokenizer_file)

    new = tmp_path / "new" / "ds"
    fail_after(1, full(new))
    line = error_of(capsys, argv(new))
    assert line.startswith(f"sinklab prep: error: writing {new}: No space left on device (the disk is full"), line
    assert line.endswith(f"; removed {tmp_path / 'new'}, which this run had created")
    assert not (tmp_path / "new").exists()

    empty = tmp_path / "empty"
    empty.mkdir()
    error_of(capsys, argv(empty))
    assert list(empty.iterdir()) == []

    out = tmp_path / "ds"
    fail_after(1, KeyboardInterrupt())
    assert main(argv(out)) == 130
    assert "interrupted; run the same command again to resume" in capsys.readouterr().err
    staged = files(out)
    done = sum(p.parts[:2] == (".partial", "done") for p in staged)
    assert done >= 1
    fail_after(done + 2, full(out))  # past the chunks resumed: this run packs two of its own
    line = error_of(capsys, argv(out))
    assert line.endswith(f"; removed what this run had written in {out}; what was there before is kept"), line
    assert files(out) == staged
    monkeypatch.setattr(ChunkRunner, "_consume", consume)
    assert main(argv(out)) == 0
    assert f"resumed {done})" in capsys.readouterr().out and load_manifest(out).splits["train"].tokens > 0
