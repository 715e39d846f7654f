from sinklab_io.notices import notice, warn, why


def test_a_notice_is_one_line_from_rank_zero_and_once_when_asked(capsys, monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        monkeypatch.delenv(var, raising=False)
    notice("test: a repeated line", once=True)
    notice("test: a repeated line", once=True)
    notice("test: said each time")
    notice("test: said each time")
    monkeypatch.setenv("SLURM_PROCID", "3")
    notice("test: from rank 3")
    assert capsys.readouterr().err.splitlines() == [
        "sinklab: test: a repeated line",
        "sinklab: test: said each time",
        "sinklab: test: said each time",
    ]


def test_why_is_the_type_and_the_first_line_of_the_message():
    assert why(OSError("disk full\nmore detail")) == "OSError: disk full"
    assert why(ValueError()) == "ValueError: "
    assert len(why(RuntimeError("x" * 500))) == len("RuntimeError: ") + 200


def test_a_warning_names_its_command(capsys):
    warn("prep", "3 files skipped")
    assert capsys.readouterr().err == "sinklab prep: warning: 3 files skipped\n"
