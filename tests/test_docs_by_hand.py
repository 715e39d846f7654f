"""Every figure of a by-hand results table is its committed JSON output's, as the page prints it."""

import json
import re
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
PAGE = RESULTS / "by-hand" / "retrofit-evals.md"
DATA = RESULTS / "data" / "retrofit-evals"
# table name -> the JSON file of a row's variant and the path of each column's figure in it
TABLES = {
    "bb-stream": ("bb-{}.json", [("perplexity", "1+15"), ("perplexity", "0+16")], "{:.2f}"),
    "smollm2-stream": ("smollm2-{}-stream.json", [("perplexity", "4+124"), ("perplexity", "0+128")], "{:.1f}"),
    "smollm2-quant": (
        "smollm2-{}-quant.json",
        [("results", s, "perplexity") for s in ("fp", "w8a8-tensor", "w8a8-tensor-intact")],
        "{:.1f}",
    ),
}


def _rows(name: str) -> list[list[str]]:
    block = re.search(rf"<!-- table: {name} -->\n(.*?)<!-- /table -->", PAGE.read_text(), re.S)
    assert block, f"{PAGE}: no table {name}"
    lines = [line for line in block.group(1).splitlines() if line.startswith("| ")][1:]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


@pytest.mark.parametrize("name", sorted(TABLES))
def test_a_by_hand_table_is_its_json(name):
    pattern, columns, fmt = TABLES[name]
    rows = _rows(name)
    assert rows
    for variant, *cells in rows:
        result = json.loads((DATA / pattern.format(variant)).read_text())
        want = []
        for path in columns:
            value = result
            for key in path:
                value = value[key]
            want.append(fmt.format(value))
        assert cells == want, variant


def test_the_bb_quantization_sentence_is_its_json():
    result = json.loads((DATA / "bb-control-quant.json").read_text())["results"]
    text = PAGE.read_text()
    assert f"perplexity {result['fp']['perplexity']:.3f} at full" in text
    assert "within 0.1%" in text and max(abs(r["gap_pct"]) for r in result.values()) < 0.1


def test_the_smollm2_outlier_sentence_is_its_json():
    text = " ".join(PAGE.read_text().split())
    retrofit, control = (
        json.loads((DATA / f"smollm2-{v}-quant.json").read_text())["outliers"]
        for v in ("sink-logit-all-open", "control")
    )
    assert f"‖h‖∞ {retrofit['max_abs'][11]:.0f} against the control's {control['max_abs'][11]:.0f}" in text
    positions = f"at {retrofit['token_positions'][11]:.1f} token positions a sequence"
    assert f"{positions} where the control has {control['token_positions'][11]:.1f}" in text
