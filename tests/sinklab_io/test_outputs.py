"""sinklab_io.outputs: the one rule for "may I write here?", and `sinklab consolidate`
held to it before its minutes-long merge."""

from __future__ import annotations

import os

import pytest
import torch

from sinklab_io.outputs import (
    MARKER,
    NotOurs,
    atomic_directory,
    claim,
    claim_directory,
    theirs,
    write_output,
    written,
)


def test_a_file_is_rewritten_only_while_it_is_what_sinklab_wrote(tmp_path):
    out = tmp_path / "out"
    report = write_output(out / "measures.json", "1", "sinklab analyze")
    assert theirs(out, ["measures.json", "new.png"]) == [] and written(out) == [report]
    write_output(report, "2", "sinklab analyze")  # its own earlier output
    assert report.read_text() == "2"
    (out / "notes.txt").write_text("mine")  # other files in --out are left alone, and not counted as output
    assert claim(out, ["measures.json"]) == out and written(out) == [report]
    report.write_text("edited")  # now partly the user's
    os.utime(report, ns=(1, 1))
    assert theirs(out, ["measures.json"]) == ["measures.json"] and written(out) == []
    with pytest.raises(NotOurs, match="already holds measures.json, which sinklab did not write .*nothing was changed"):
        claim(out, ["measures.json", "plot.png"])
    with pytest.raises(NotOurs, match="measures.json exists, which sinklab did not write"):
        write_output(report, "3", "sinklab analyze")
    assert report.read_text() == "edited"
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "measures.json", "notes.txt"]  # no temporary left
    with pytest.raises(NotOurs, match="is a file; name a directory"):
        claim(report, ["x"])


@pytest.mark.parametrize("marker", ["[1, 2]", '"files"', "null", '{"files": 3}', '{"files": {"measures.json": "x"}}'])
def test_a_marker_of_any_other_shape_vouches_for_nothing(marker, tmp_path):
    """A marker that is valid JSON of the wrong shape crashed every command that claims an output."""
    (tmp_path / "measures.json").write_text("mine")
    (tmp_path / MARKER).write_text(marker)
    assert theirs(tmp_path, ["measures.json"]) == ["measures.json"] and written(tmp_path) == []
    with pytest.raises(NotOurs, match="already holds measures.json, which sinklab did not write"):
        claim(tmp_path, ["measures.json"])
    with pytest.raises(NotOurs, match="measures.json exists, which sinklab did not write"):
        write_output(tmp_path / "measures.json", "1", "sinklab analyze")
    with pytest.raises(NotOurs, match="holds measures.json, which this command did not write"):
        claim_directory(tmp_path, "sinklab export-hf")
    assert (tmp_path / "measures.json").read_text() == "mine"


def test_a_file_in_a_first_format_marker_is_the_users(tmp_path):
    """The first marker format names files without a size or hash: it cannot tell a README edited
    since, so a second export replaced the user's edit without a word."""
    (tmp_path / "README.md").write_text("edited by hand")
    (tmp_path / MARKER).write_text('{"kind": "sinklab export-hf", "files": ["README.md"]}')
    with pytest.raises(NotOurs, match="holds README.md, which this command did not write"):
        with atomic_directory(tmp_path, "sinklab export-hf"):
            pytest.fail("refused before any work")
    assert (tmp_path / "README.md").read_text() == "edited by hand"


def test_a_command_replaces_only_its_own_output_for_the_same_subject(tmp_path):
    report = write_output(tmp_path / "measures.json", "1", "sinklab analyze of a")
    write_output(report, "2", "sinklab analyze of a")
    for other in ("sinklab report of e at scale cpu", "sinklab analyze of b"):
        assert theirs(tmp_path, ["measures.json"], other) == ["measures.json"]
        with pytest.raises(NotOurs, match="already holds measures.json, which sinklab analyze of a wrote"):
            claim(tmp_path, ["measures.json"], by=other)
        with pytest.raises(NotOurs, match="measures.json exists, which sinklab analyze of a wrote"):
            write_output(report, "3", other)
    assert report.read_text() == "2" and written(tmp_path) == [report]


def test_a_whole_directory_edited_since_it_was_written_is_refused(tmp_path):
    out = tmp_path / "model"
    with atomic_directory(out, kind="test") as tmp:
        (tmp / "weights").write_text("1")
    (out / "weights").write_text("fine-tuned by hand")
    with pytest.raises(NotOurs, match="holds weights, which this command did not write"):
        with atomic_directory(out, kind="test"):
            pytest.fail("refused before any work")
    assert (out / "weights").read_text() == "fine-tuned by hand"


def test_consolidate_never_replaces_a_file_it_did_not_write(tmp_path, capsys):
    """`sinklab consolidate CKPT OUT` never replaces another run's newest checkpoint."""
    from pipeline.train.consolidate import main

    zero = tmp_path / "step-000004.ckpt"  # a DeepSpeed checkpoint directory (refused before it is read)
    zero.mkdir()
    (zero / "latest").write_text("global_step4")
    other = tmp_path / "other" / "checkpoints" / "step-000024.ckpt"
    other.parent.mkdir(parents=True)
    torch.save({"global_step": 24}, other)
    before = other.read_bytes()
    assert main([str(zero), str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"sinklab consolidate: OUT {other}: step-000024.ckpt exists, which sinklab did not write (or which changed "
        "since); nothing was changed. Give a new file name, or move that file away"
    )
    assert other.read_bytes() == before and sorted(p.name for p in other.parent.iterdir()) == ["step-000024.ckpt"]
    merged = write_output(tmp_path / "merged.ckpt", b"another checkpoint's merge", f"sinklab consolidate of {other}")
    assert main([str(zero), str(merged)]) == 2
    assert f"merged.ckpt exists, which sinklab consolidate of {other} wrote" in capsys.readouterr().err
    assert merged.read_bytes() == b"another checkpoint's merge"
