"""Experiment files, configs/experiments/<group>/<name>.yaml (docs/experiments.md), loaded into typed specs by a
type-checked reading whose errors name the file, line and field."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from pipeline import metric_names as N
from pipeline.model.config import ConfigError, refuse_renamed

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS_DIR = REPO / "configs" / "experiments"
SCALES = ("paper", "cpu", "gpu")
REQUIRED_SCALES = ("paper", "cpu")  # gpu (one lent GPU) is opt-in per file
MAX_SEEDS = 1000  # runs per variant: a larger count is a slip (the plan lists every run)
TEXT_KEYS = ("title", "group", "paper_ref", "description", "cpu_notes", "paper_notes")
TOP_KEYS = {*TEXT_KEYS, "name", "scale", "columns", "variants", "plot"}
PLOT_KEYS = {"kind", "metric", "x", "title"}
PLOT_KINDS = ("curve", "bar")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._+-]*$")
SEED_KEYS = ("seed_everything", "data.seed")  # set per run by the sweep's seed axis


class ExperimentError(ValueError):
    """A malformed experiment file; the message starts with `file:line: field:`."""


class Reader:
    def __init__(self, path: Path, text: str):
        self.path, self.lines = path, {}  # each YAML path (tuple of keys / indices) to its 1-based line
        root = yaml.compose(text)
        if root is not None:
            self._walk(root, ())

    def _walk(self, node: yaml.Node, path: tuple) -> None:
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                self._walk(value_node, path + (key_node.value,))
                self.lines[path + (key_node.value,)] = key_node.start_mark.line + 1  # the key's line, not the value's
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._walk(item, path + (i,))

    def fail(self, path: tuple, message: str) -> ExperimentError:
        """`file:line: field: message`, the line of the field or of its nearest enclosing one in the file."""
        probe = path
        while probe and probe not in self.lines:
            probe = probe[:-1]
        dotted = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(path))
        return ExperimentError(f"{self.path}:{self.lines.get(probe, 1)}: {dotted or '<top>'}: {message}")

    def mapping(self, value: Any, path: tuple, allowed: set[str] | None = None, required: tuple[str, ...] = ()) -> dict:
        value = {} if value is None else value
        if not isinstance(value, dict):
            raise self.fail(path, f"expected a mapping, got {type(value).__name__}")
        if allowed is not None:
            for key in value:
                if key not in allowed:
                    raise self.fail(path + (key,), f"unknown field {key!r}; allowed: " + ", ".join(sorted(allowed)))
        for key in required:
            if key not in value:
                raise self.fail(path, f"missing required field {key!r}")
        return value

    def text(self, value: Any, path: tuple, optional: bool = False) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.fail(path, f"expected a non-empty string, got {value!r}")
        return value.strip()

    def metric(self, value: Any, path: tuple) -> str:
        value = self.text(value, path)
        if not N.is_metric(value):
            raise self.fail(
                path, f"{value!r} is not a metric name; SinkLab's start with one of {', '.join(N.NAMESPACES)}"
            )
        return value

    def name(self, value: Any, path: tuple) -> str:
        value = self.text(value, path)
        if not NAME_RE.match(value):
            raise self.fail(
                path,
                f"{value!r} is not a valid name (lowercase letters, digits, and . _ + - ; it becomes a directory name)",
            )
        return value

    def overrides(self, value: Any, path: tuple) -> dict[str, Any]:
        value = self.mapping(value, path)
        for key, item in value.items():
            if not isinstance(key, str) or not re.match(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$", key):
                raise self.fail(
                    path + (key,), f"override key {key!r} must be a dotted config path such as arch.n_heads"
                )
            try:
                refuse_renamed(key, "")
            except ConfigError as err:
                raise self.fail(path + (key,), str(err)) from None
            if key in SEED_KEYS:
                raise self.fail(
                    path + (key,),
                    f"{key} is set by the sweep: seeds are an axis of their own (scale.<scale>.seeds: N, "
                    "or `sinklab sweep --seeds N`); remove this override",
                )
            if isinstance(item, dict):
                raise self.fail(
                    path + (key,), "override values must be scalars or lists; write nested fields as dotted keys"
                )
        return dict(value)


@dataclass(frozen=True)
class Column:
    """One metric column of the paper's table: `metric` is the MLflow metric name."""

    key: str
    metric: str
    label: str
    digits: int = 2  # decimals in the report


@dataclass(frozen=True)
class Variant:
    name: str
    label: str
    overrides: dict[str, Any]
    cpu_overrides: dict[str, Any]
    paper_overrides: dict[str, Any]
    paper: dict[str, float | None]
    gpu_overrides: dict[str, Any] = field(default_factory=dict)
    paper_source: str | None = None
    paper_status: str | None = None  # e.g. "training failure" where the paper reports "-"
    note: str | None = None


@dataclass(frozen=True)
class ScaleSetup:
    recipe: str  # path relative to the repository root
    overrides: dict[str, Any]
    # a column's metric under another name at this scale (streaming caches are sized by C)
    metrics: dict[str, str] = field(default_factory=dict)
    seeds: int = 1  # runs per variant, seeds recipe seed + 0 .. seeds - 1 (`sinklab sweep --seeds` overrides)


@dataclass(frozen=True)
class PlotSpec:
    kind: str  # "curve": metric over steps, one line per variant; "bar": final metric per variant
    metric: str
    title: str


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    group: str
    paper_ref: str
    description: str
    scales: dict[str, ScaleSetup]
    columns: list[Column]
    variants: list[Variant]
    path: Path
    cpu_notes: str | None = None
    paper_notes: str | None = None
    plot: PlotSpec | None = None

    @property
    def mlflow_experiment(self) -> str:
        return f"sinklab/{self.name}"

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        raise ExperimentError(
            f"{self.name}: no variant {name!r}; variants: " + ", ".join(v.name for v in self.variants)
        )

    def setup(self, scale: str) -> ScaleSetup:
        if scale not in self.scales:
            raise ExperimentError(
                f"{self.path}: scale.{scale}: this experiment has no {scale} scale; it has "
                f"{', '.join(self.scales)} (a file opts in with scale.{scale}: {{recipe: ...}})"
            )
        return self.scales[scale]

    def metric(self, column: Column, scale: str) -> str:
        return self.setup(scale).metrics.get(column.metric, column.metric)

    def overrides(self, variant: Variant, scale: str) -> dict[str, Any]:
        """The scale's base overrides, then the variant's, then its own at this scale (the last wins)."""
        return {**self.setup(scale).overrides, **variant.overrides, **getattr(variant, f"{scale}_overrides")}


# the fields of a variant, a column and a scale are what their entries may set
VARIANT_KEYS, COLUMN_KEYS, SCALE_KEYS = ({f.name for f in fields(kind)} for kind in (Variant, Column, ScaleSetup))


def experiment_files() -> list[Path]:
    """Every experiment file; folders whose name starts with `_` hold shared recipes."""
    return sorted(
        p
        for p in EXPERIMENTS_DIR.rglob("*.yaml")
        if not any(part.startswith("_") for part in p.relative_to(EXPERIMENTS_DIR).parts)
    )


def load_experiment(name_or_path: str | Path) -> Experiment:
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml") or not path.exists():
        matches = [p for p in experiment_files() if p.stem == str(name_or_path)]
        if len(matches) > 1:
            raise ExperimentError(f"experiment name {name_or_path!r} is ambiguous: " + ", ".join(map(str, matches)))
        if not matches:
            known = ", ".join(p.stem for p in experiment_files()) or "(none)"
            raise ExperimentError(f"no experiment {name_or_path!r} under {EXPERIMENTS_DIR}; known: {known}")
        path = matches[0]
    text = path.read_text()
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ExperimentError(f"{path}: not valid YAML: {err}") from None
    r = Reader(path.resolve().relative_to(REPO) if path.resolve().is_relative_to(REPO) else path, text)
    top = r.mapping(raw, (), TOP_KEYS, required=("name", "title", "paper_ref", "scale", "columns", "variants"))
    name = r.name(top["name"], ("name",))
    if name != path.stem:
        raise r.fail(("name",), f"name {name!r} must equal the file name {path.stem!r}")

    scale_raw = r.mapping(top["scale"], ("scale",), set(SCALES), required=REQUIRED_SCALES)
    scales = {}
    for scale in (s for s in SCALES if s in scale_raw):
        at = ("scale", scale)
        s = r.mapping(scale_raw[scale], at, SCALE_KEYS, required=("recipe",))
        metrics = r.mapping(s.get("metrics"), at + ("metrics",))
        seeds = 1 if s.get("seeds") is None else s["seeds"]
        if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= MAX_SEEDS:
            raise r.fail(at + ("seeds",), f"expected a whole number in 1..{MAX_SEEDS}, got {seeds!r}")
        scales[scale] = ScaleSetup(
            r.text(s["recipe"], at + ("recipe",)),
            r.overrides(s.get("overrides"), at + ("overrides",)),
            {k: r.metric(v, at + ("metrics", k)) for k, v in metrics.items()},
            seeds,
        )

    columns_raw = top["columns"]
    if not isinstance(columns_raw, list) or not columns_raw:
        raise r.fail(("columns",), "expected a non-empty list of {key, metric, label}")
    columns = []
    for i, c in enumerate(columns_raw):
        c = r.mapping(c, ("columns", i), COLUMN_KEYS, required=("key", "metric", "label"))
        digits = c.get("digits", 2)
        if isinstance(digits, bool) or not isinstance(digits, int) or not 0 <= digits <= 6:
            raise r.fail(("columns", i, "digits"), f"expected a whole number of decimals from 0 to 6, got {digits!r}")
        columns.append(
            Column(
                r.name(c["key"], ("columns", i, "key")),
                r.metric(c["metric"], ("columns", i, "metric")),
                r.text(c["label"], ("columns", i, "label")),
                digits,
            )
        )
    keys = [c.key for c in columns]
    if len(set(keys)) != len(keys):
        raise r.fail(("columns",), f"column keys must be unique, got {keys}")
    for scale, setup in scales.items():
        unknown = sorted(set(setup.metrics) - {c.metric for c in columns})
        if unknown:
            raise r.fail(
                ("scale", scale, "metrics", unknown[0]),
                f"renames {unknown[0]!r}, which no column reads; columns read {[c.metric for c in columns]}",
            )

    variants_raw = top["variants"]
    if not isinstance(variants_raw, list) or not variants_raw:
        raise r.fail(("variants",), "expected a non-empty list of variants")
    variants = [_parse_variant(v, i, r, keys) for i, v in enumerate(variants_raw)]
    names = [v.name for v in variants]
    for i, n in enumerate(names):
        if n in names[:i]:
            raise r.fail(("variants", i, "name"), f"variant name {n!r} is used twice")

    plot = None
    if top.get("plot") is not None:
        p = r.mapping(top["plot"], ("plot",), PLOT_KEYS, required=("kind", "metric"))
        if p["kind"] not in PLOT_KINDS:
            raise r.fail(("plot", "kind"), f"expected one of {PLOT_KINDS}, got {p['kind']!r}")
        plot = PlotSpec(
            p["kind"],
            r.metric(p["metric"], ("plot", "metric")),
            r.text(p.get("title"), ("plot", "title"), optional=True) or top["title"],
        )

    texts = {k: r.text(top.get(k), (k,), optional=k not in ("title", "paper_ref")) for k in TEXT_KEYS}
    texts |= {"group": texts["group"] or path.parent.name, "description": texts["description"] or ""}
    return Experiment(name=name, scales=scales, columns=columns, variants=variants, path=path, plot=plot, **texts)


def _parse_variant(raw: Any, i: int, r: Reader, column_keys: list[str]) -> Variant:
    at = ("variants", i)
    v = r.mapping(raw, at, VARIANT_KEYS, required=("name",))
    name = r.name(v["name"], at + ("name",))
    paper_raw = r.mapping(v.get("paper"), at + ("paper",))
    paper = dict.fromkeys(column_keys)
    for key, value in paper_raw.items():
        if key not in column_keys:
            raise r.fail(at + ("paper", key), f"no column {key!r}; columns: {', '.join(column_keys)}")
        if isinstance(value, bool) or not isinstance(value, (int, float, type(None))):
            raise r.fail(
                at + ("paper", key), f"expected a number or null (null where the paper gives no number), got {value!r}"
            )
        paper[key] = None if value is None else float(value)
    parsed = {}
    for key in (f.name for f in fields(Variant) if f.name not in ("name", "paper")):
        if key.endswith("overrides"):
            parsed[key] = r.overrides(v.get(key), at + (key,))
        else:
            parsed[key] = r.text(v.get(key), at + (key,), optional=True)
    return Variant(**parsed | {"name": name, "label": parsed["label"] or name, "paper": paper})
