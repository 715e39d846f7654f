"""design.md's import rules, held against the source (every import, module level or inside a
function; those under ``if TYPE_CHECKING:`` are annotations only and do not count)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCE = ("sinklab_io", "data_prep", "pipeline", "cluster", "benchmarks")
THE_TRAINING_LAYER = (
    "lightning",
    "mlflow",
    "deepspeed",
    "pipeline.train",
    "pipeline.checkpoint",
    "pipeline.tracking",
    "pipeline.experiments",
)


def _module(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            skipped |= {id(n) for n in ast.walk(node)}
    return skipped


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, relative imports made absolute."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_only(tree)
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}  # `from pipeline import tracking`
    return found


def sources(*parts: str) -> list[Path]:
    return sorted(f for part in parts for f in (REPO / part).rglob("*.py")) if parts else []


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def broken(files: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{f.relative_to(REPO)} imports {name}" for f in files for name in sorted(imports(f)) if under(name, forbidden)
    ]


def test_mlflow_is_imported_only_inside_pipeline_tracking():
    outside = [f for f in sources(*SOURCE) if not f.is_relative_to(REPO / "pipeline" / "tracking")]
    assert broken(outside, ("mlflow",)) == []


def test_the_rules_are_read_from_real_imports(tmp_path):
    """The walk sees imports inside functions and relative ones, and passes over TYPE_CHECKING."""
    pkg = REPO / "pipeline" / "train" / "module.py"
    assert "pipeline.tracking" in imports(pkg.with_name("init_from.py"))  # inside a function
    assert "pipeline.checkpoint.NonFiniteLossError" in imports(pkg)
    assert "pipeline.tracking.metrics_file" in imports(REPO / "pipeline" / "tracking" / "logger.py")
    assert "pipeline.experiments.spec" not in imports(REPO / "pipeline" / "tracking" / "runs.py")
    assert broken([REPO / "pipeline" / "tracking" / "runs.py"], ("mlflow",))  # it does import mlflow


@pytest.mark.parametrize(
    "parts, forbidden",
    [
        # the model, the kernels, the metrics and the probe know only torch (and each other)
        (
            (
                "pipeline/model",
                "pipeline/kernels",
                "pipeline/metrics.py",
                "pipeline/probe.py",
                "pipeline/probe_metrics.py",
                "pipeline/sink_measures.py",
                "pipeline/outliers.py",
                "pipeline/flops.py",
                "pipeline/plots.py",
            ),
            THE_TRAINING_LAYER + ("pipeline.analysis", "data_prep", "cluster", "jsonargparse"),
        ),
        # the metric names: standard library only, so that every layer above reads them
        (
            ("pipeline/metric_names.py",),
            ("pipeline", "sinklab_io", "data_prep", "torch", "numpy", "lightning", "mlflow"),
        ),
        # data_prep knows nothing of pipeline or cluster
        (("data_prep",), ("pipeline", "cluster", "lightning", "mlflow")),
        # utilities every layer needs sit below all of them
        (("sinklab_io",), ("pipeline", "data_prep", "cluster", "torch", "numpy")),
        # cluster renders and submits jobs; it does not import the training layer
        (("cluster",), THE_TRAINING_LAYER + ("torch",)),
        # training does not import analysis
        (("pipeline/train", "pipeline/checkpoint"), ("pipeline.analysis",)),
        # tracking and checkpoints sit below training and analysis
        (("pipeline/tracking",), ("pipeline.train", "pipeline.analysis", "pipeline.experiments")),
        (
            ("pipeline/checkpoint",),
            ("mlflow", "pipeline.train", "pipeline.tracking", "pipeline.analysis", "pipeline.experiments"),
        ),
    ],
    ids=[
        "model-kernels-metrics",
        "metric-names",
        "data_prep",
        "sinklab_io",
        "cluster",
        "train",
        "tracking",
        "checkpoint",
    ],
)
def test_design_import_rules(parts, forbidden):
    files = [f for part in parts for f in ([REPO / part] if part.endswith(".py") else sources(part))]
    assert files and broken(files, forbidden) == []


def test_other_parts_reach_tracking_and_checkpoints_through_their_packages():
    """One public surface each: outside the room, ``pipeline.tracking`` / ``pipeline.checkpoint``
    and the names they export, never a module inside (``python -m`` entry points aside)."""
    rooms = ("pipeline.tracking", "pipeline.checkpoint")
    found = []
    for f in sources(*SOURCE):
        own = _module(f)
        for name in imports(f):
            room = next((r for r in rooms if name.startswith(r + ".")), None)
            if room is None or own.startswith(room):
                continue
            inner = name[len(room) + 1 :].split(".")[0]
            module = REPO.joinpath(*room.split("."), inner)
            if module.with_suffix(".py").exists() or module.is_dir():
                found.append(f"{f.relative_to(REPO)} imports {name}")
    assert found == []


MAX_MODULE_LINES = 350


def test_modules_stay_within_350_lines():
    lengths = {str(f.relative_to(REPO)): len(f.read_text().splitlines()) for f in sources(*SOURCE)}
    too_long = {path: n for path, n in lengths.items() if n > MAX_MODULE_LINES}
    assert too_long == {}, f"modules over {MAX_MODULE_LINES} lines (split along a seam): {too_long}"
