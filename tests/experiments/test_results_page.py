"""The results pages in docs/results: each one `sinklab report --docs` may regenerate."""

from __future__ import annotations

from pathlib import Path

from pipeline.experiments import results_page
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
