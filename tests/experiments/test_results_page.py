"""The results pages in docs/results: each one `sinklab report --docs` may regenerate."""

from __future__ import annotations

from pathlib import Path

from pipeline.experiments import results_page
from pipeline.experiments.agreement import Agreement, adjust, from_data
from pipeline.experiments.stats import Interval, Permutation
from sinklab_io.outputs import theirs

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def test_every_results_page_is_the_commands_own_outside_its_prose():
    pages = sorted(p.stem for p in RESULTS.glob("*.md") if p.name not in (results_page.INDEX, "cpu-scale.md"))
    assert len(pages) >= 17
    # an edit outside a page's prose region would make the command refuse to regenerate it
    for name in pages:
        assert theirs(RESULTS, [f"{name}.md"], results_page.page_by(name)) == [], name
    assert theirs(RESULTS, [results_page.INDEX], results_page.INDEX_BY) == []
    assert all(f"[{name}]({name}.md)" in (RESULTS / results_page.INDEX).read_text() for name in pages)


def test_the_index_judges_every_page_s_agreement_rows_over_one_holm_family(tmp_path):
    """Two pages whose rows pass alone (p 0.02 and 0.015 in rho's direction, each page a family of one): over the
    index's family of both, Holm gives 2 · 0.015 = 0.03 to both, and neither keeps its verdict."""

    def row(key, rho, p, p_reversed):
        interval = Interval(0.5, 1.0, 2000, 2000) if rho > 0 else Interval(-1.0, -0.5, 2000, 2000)
        found = Agreement(key, key, 6, rho, rho, interval, interval, 3, Permutation(p, p_reversed, 720, True), 6)
        return adjust([found])[0]

    undefined = adjust([Agreement("val_loss", "valid loss", 1, None, None, min_seeds=3, distinct=1)])[0]
    pages = {"one": [row("sink1", 0.9, 0.02, 0.99), undefined], "two": [row("sink1", -0.9, 0.99, 0.015)]}
    assert [rows[0].verdict for rows in pages.values()] == ["ordering reproduced", "ordering reversed"]
    for name, rows in pages.items():
        results_page.write_page(tmp_path, name, f"## {name}: study {name}\n\nits report\n", rows)
    assert from_data((tmp_path / "one.md").read_text())[0] == pages["one"][0]
    index = (tmp_path / results_page.INDEX).read_text()
    assert "over the family of this index, its 2 rows with a p (one: sink1, two: sink1)" in index
    assert (
        "| one | sink1 | 6 | 3 | +0.90 [+0.50, +1.00] | 0.02 (all 720) | 0.03 | 6 | no verdict: p = 0.02, Holm "
        in index
    )
    assert (
        "| two | sink1 | 6 | 3 | -0.90 [-1.00, -0.50] | 0.015 (all 720) | 0.03 | 6 | no verdict: p = 0.015 for a "
        in index
    )
    assert "| one | valid loss | 1 | 3 | — | — | — | 1 | undefined |" in index
    assert "ordering re" not in index
    # a page with no agreement rows leaves the family empty
    results_page.write_page(tmp_path / "bare", "bb", "## bb: a study\n\nno paper values\n")
    assert "the index's family is empty" in (tmp_path / "bare" / results_page.INDEX).read_text()
