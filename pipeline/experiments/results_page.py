"""`sinklab report ... --docs DIR`: the report as DIR/<experiment>.md, its runs as DIR/data/<experiment>.csv and the
index DIR/README.md, each page with a prose region between PROSE's lines that a rewrite keeps as it stands
(docs/experiments.md, Results pages)."""

from __future__ import annotations

from pathlib import Path

from pipeline.experiments.agreement import Agreement, data_line, from_data, index_markdown
from sinklab_io.outputs import claim, outside, write_output, written

PROSE = ["<!-- prose: kept as it stands when this page is regenerated -->", "<!-- /prose -->"]
INDEX = "README.md"
INDEX_BY = "sinklab report --docs (the index)"
DATA = "data"  # DIR/data/<experiment>.csv: the runs a page renders


def page_by(experiment: str) -> str:
    return f"sinklab report --docs of {experiment}"


def data_by(experiment: str) -> str:
    return f"sinklab report --docs of {experiment} (its runs)"


def claim_pages(out: Path, experiment: str) -> None:
    """Refuse (``NotOurs``) before any work where the page, its data file or the index is not this command's."""
    claim(out, [f"{experiment}.md"], "--docs", page_by(experiment))
    claim(out / DATA, [f"{experiment}.csv"], "--docs", data_by(experiment))
    claim(out, [INDEX], "--docs", INDEX_BY)


def prose_of(path: Path) -> str:
    """The prose region of the page at ``path`` (its lines between PROSE's), "" where there is none."""
    if not path.is_file() or outside(path.read_bytes(), PROSE) is None:
        return ""
    text = path.read_text(encoding="utf-8")
    return text[text.index(PROSE[0]) + len(PROSE[0]) : text.index(PROSE[1])].strip("\n")


def with_prose(generated: str, prose: str, tail: str = "") -> str:
    body = f"{prose}\n" if prose else ""
    return f"{generated.rstrip()}\n\n{PROSE[0]}\n{body}{PROSE[1]}\n" + (f"\n{tail.rstrip()}\n" if tail else "")


def title_of(path: Path) -> str:
    heading = next((line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("## ")), "")
    return heading.removeprefix("## ").removeprefix(f"{path.stem}: ") or path.stem


def write_index(out: Path) -> Path:
    pages = [p for p in written(out) if p.suffix == ".md" and p.name != INDEX]
    head = (
        "# Results\n\nOne page per study, each written by `sinklab report EXPERIMENT --scale S --docs DIR` from "
        "the study's MLflow runs, which it keeps in data/EXPERIMENT.csv: `sinklab report EXPERIMENT --from "
        "DIR/data/EXPERIMENT.csv --docs DIR` writes the page again from that file alone (the command and date at its "
        "top); this index is rewritten with every page."
    )
    table = ["| page | study |", "|---|---|"] + [f"| [{p.stem}]({p.name}) | {title_of(p)} |" for p in pages]
    table += index_markdown([(p.stem, from_data(p.read_text(encoding="utf-8"))) for p in pages])
    index = out / INDEX
    return write_output(index, with_prose(head, prose_of(index), "\n".join(table)), INDEX_BY, PROSE)


def write_page(
    out: Path, experiment: str, generated: str, found: list[Agreement] = (), *, data: str | None = None
) -> list[Path]:
    """The data file (where ``data`` is given), the page (agreement rows ``found``, its prose kept) and the index."""
    table = [write_output(out / DATA / f"{experiment}.csv", data, data_by(experiment))] if data is not None else []
    page = out / f"{experiment}.md"
    generated = f"{generated.rstrip()}\n\n{data_line(found)}\n" if found else generated
    write_output(page, with_prose(generated, prose_of(page)), page_by(experiment), PROSE)
    return [*table, page, write_index(out)]
