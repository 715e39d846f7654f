"""Metric names are written once, in pipeline/metric_names.py: no other source file spells one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pipeline import metric_names as N
from pipeline import probe_metrics

REPO = Path(__file__).resolve().parents[1]
SOURCE = ("sinklab_io", "data_prep", "pipeline", "cluster", "benchmarks")
HOME = REPO / "pipeline" / "metric_names.py"
# a whole string that is a metric name or the start of one: a namespace, then name characters only
WHOLE = re.compile(rf"({'|'.join(re.escape(ns) for ns in N.NAMESPACES)})[\w.{{}}/+-]*")


def spelled(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every string constant that is a metric name, and every f-string that
    starts with one, in ``tree`` (prose such as docstrings has spaces and is passed over)."""
    found = []
    inside_fstrings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if (
                isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and first.value.startswith(N.NAMESPACES)
            ):
                found.append((node.lineno, first.value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inside_fstrings:
            if WHOLE.fullmatch(node.value) or re.match(rf"\^?\(?{WHOLE.pattern}", node.value):
                found.append((node.lineno, node.value))
    return found


def test_no_metric_name_is_spelled_outside_its_home():
    files = sorted(f for part in SOURCE for f in (REPO / part).rglob("*.py") if f != HOME)
    found = [
        f"{f.relative_to(REPO)}:{line}: {text!r}" for f in files for line, text in spelled(ast.parse(f.read_text()))
    ]
    assert found == [], "use pipeline.metric_names:\n" + "\n".join(found)


def test_the_search_sees_every_way_a_name_is_written():
    source = '''
"""Logs ``sink/sink1`` every step: prose is passed over."""
a = {"sink/sink1": 1.0}
b = f"act/massive_ratio_l{l}"
c = "stream/ppl_" + key
d = re.compile(r"heads/(alpha1|entropy)_l\\d+")
e = "hf/"  # not a namespace of metrics
'''
    assert sorted(line for line, _ in spelled(ast.parse(source))) == [3, 4, 5, 6]


def test_names():
    assert N.layer(N.FLOW_ENTROPY, 3) == "flow/entropy_l3"
    assert N.head(N.HEAD_ALPHA1, 0, 2) == "heads/alpha1_l0_h2"
    assert N.sink_k(1) == "sink/sink_k1" and N.emerged_step("sink1_1pct") == "sink/emerged_step_sink1_1pct"
    assert N.is_metric("sink/sink1") and N.is_metric("stream/ppl_sink4_window252")
    assert not N.is_metric("sink1") and not N.is_metric("sink/") and not N.is_metric("foo/bar")


def test_the_probe_registry_names_its_metrics_once():
    """A registered probe metric's names are metric names that neither another registration nor a constant
    of pipeline/metric_names.py also gives."""
    names = [n for m in probe_metrics.REGISTRY.values() for n in (m.name, m.head_name) if n is not None]
    constants = {v for k, v in vars(N).items() if k.isupper() and isinstance(v, str) and not k.endswith("_IMAGE")}
    assert all(N.is_metric(n) for n in names) and len(set(names)) == len(names)
    assert set(names).isdisjoint(constants)
