"""The MLflow UI view of SinkLab's training experiments: training mode, chart layout, runs-table columns,
links (docs/training.md, "The view")."""

from __future__ import annotations

import json
import re
import time

from pipeline import metric_names as N
from pipeline import metrics as M
from pipeline import probe_metrics
from pipeline.metric_names import ALPHA1_IMAGE, MAX_LOGIT_IMAGE, TRAJECTORY_IMAGE
from pipeline.model.config import ARCH

from .contract import TAG_KIND, TAG_SEED, TAG_VARIANT

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_KIND = "custom_model_development"
WORKFLOW_TYPE = "machine_learning"
SHARED_VIEW_KEY = "sinklab-view-v4"
VIEW_NAME = "SinkLab: sink and loss first"
VIEW_TAG = "mlflow.sharedViewState." + SHARED_VIEW_KEY

HEADLINE = (N.SINK1, N.ALPHA1_MEAN, N.VAL_LOSS, N.TRAIN_LOSS)
HEADLINE_SECTION = "Sink and loss"
# training stability: the largest pre-softmax logit and the steps the spike guard skipped
STABILITY = (probe_metrics.name("max_logit"), N.SKIPPED_STEPS)
STABILITY_SECTION = "Stability"
HEADS_SECTION = "α₁ per head"
# below the headline, collapsed, in this order; the UI's own names for system and unprefixed metrics
SECTIONS = (
    *(ns.rstrip("/") for ns in (N.SINK, N.VAL, N.TRAIN, N.HEADS, N.ATTN, N.ACT, N.PERF, N.ANALYSIS)),
    "System metrics",
    "Model metrics",
)
# kept as metrics (reports read them), no chart: flat or one-point series, and Sink_k at k = 1 (Sink_1)
HIDDEN = (N.ALPHA1_UNIFORM, *(N.emerged_step(n) for n in (*M.EMERGENCE_SINK1, *M.EMERGENCE_ALPHA1)), N.sink_k(1))

# the runs-table columns: the factors the study varies (design.md), where they differ between runs
FACTOR_PREFIXES = (f"{ARCH}.", "optim.", "data.interventions", "data.token_budget")
DEFAULT_FACTORS = (f"{ARCH}.attention.op", f"{ARCH}.positional", "optim.weight_decay")
MAX_FACTOR_COLUMNS = 6


def sent_to_mlflow(name: str) -> bool:
    """Whether a metrics.jsonl metric goes to MLflow: not a per-head scalar (those stay in the file and images)."""
    per_head = "|".join(map(re.escape, (N.HEAD_ALPHA1, *probe_metrics.head_names())))
    return not re.fullmatch(rf"({per_head})_l\d+_h\d+", name)


def _card(uuid: str, section: str, **fields) -> dict:
    return {
        "uuid": uuid,
        "metricSectionId": section,
        "deleted": False,
        "isGenerated": False,
        "runsCountToCompare": 100,
        **fields,
    }


def line_card(metric: str, section: str) -> dict:
    return _card(
        f"sinklab-{metric}",
        section,
        type="LINE",
        metricKey=metric,
        selectedMetricKeys=[metric],
        displayName=metric,
        xAxisKey="step",
        selectedXAxisMetricKey="",
        scaleType="linear",
        xAxisScaleType="linear",
        lineSmoothness=0,
        useGlobalXaxisKey=True,
        useGlobalLineSmoothing=True,
        yAxisKey="metric",
        yAxisExpressions=[],
        ignoreOutliers=False,
        range={"xMin": None, "xMax": None, "yMin": None, "yMax": None},
    )


def image_card(key: str, section: str) -> dict:
    return _card(f"sinklab-{key}", section, type="IMAGE", imageKeys=[key], step=0, showRunParams=False)


def section_uuid(name: str) -> str:
    return "sinklab-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def chart_cards() -> list[dict]:
    """The headline, stability and α₁ image rows, and hidden placeholders for flat series."""
    head, stable, heads = (section_uuid(s) for s in (HEADLINE_SECTION, STABILITY_SECTION, HEADS_SECTION))
    # generated + deleted: the UI keeps a hidden metric hidden and adds no chart for it
    hidden = {"deleted": True, "isGenerated": True}
    return (
        [line_card(m, head) for m in HEADLINE]
        + [line_card(m, stable) for m in STABILITY]
        + [image_card(MAX_LOGIT_IMAGE, stable)]
        + [image_card(key, heads) for key in (ALPHA1_IMAGE, TRAJECTORY_IMAGE)]
        + [line_card(m, section_uuid(m.rsplit("/", 1)[0])) | hidden for m in HIDDEN]
    )


def section(name: str, expanded: bool, **layout) -> dict:
    # isReordered: charts of metrics first seen later are appended, not sorted in front of the listed ones
    return {
        "uuid": section_uuid(name),
        "name": name,
        "display": expanded,
        "isReordered": True,
        "deleted": False,
        "isGenerated": not layout,
        **layout,
    }


def sections() -> list[dict]:
    """The headline row (4 across), stability (3 across), the α₁ images (2 across), then the rest collapsed."""
    return [
        section(HEADLINE_SECTION, True, columns=4, cardHeight=300),
        section(STABILITY_SECTION, True, columns=3, cardHeight=300),
        section(HEADS_SECTION, True, columns=2, cardHeight=420),
        *(section(name, False) for name in SECTIONS),
    ]


def table_columns(factors: list[str]) -> list[str]:
    """The runs table: variant, seed, the factors, final Sink_1, mean α₁ and validation loss, the model
    (not the wide Dataset column: the dataset is one per experiment, in each run's page)."""
    return (
        [f"tags.`{TAG_VARIANT}`", f"tags.`{TAG_SEED}`"]
        + [f"params.`{p}`" for p in factors]
        + [f"metrics.`{m}`" for m in HEADLINE[:3]]
        + ["attributes.`Models`"]
    )


def view_state(factors: list[str], seeded: bool = False) -> dict:
    # by run name: by date, the UI nests a sweep's variants under their collapsed parent
    return {
        "compareRunCharts": chart_cards(),
        "compareRunSections": sections(),
        "isAccordionReordered": True,
        "selectedColumns": table_columns(factors),
        "runsExpanded": {},
        "runsPinned": [],
        "runsHidden": [],
        "runsVisibilityMap": {},
        "runsHiddenMode": "SHOW_ALL",
        "viewMaximized": False,
        "runListHidden": False,
        # the runs grouped by the variant tag, charts drawing each group's average
        "groupBy": {"aggregateFunction": "average", "groupByKeys": [{"mode": "tag", "groupByData": TAG_VARIANT}]}
        if seeded
        else None,
        "groupsExpanded": {},
        "useGroupedValuesInCharts": True,
        "hideEmptyCharts": True,
        "autoRefreshEnabled": True,
        "globalLineChartConfig": {"xAxisKey": "step", "lineSmoothness": 0, "selectedXAxisMetricKey": ""},
        "orderByKey": "tags.`mlflow.runName`",
        "orderByAsc": True,
    }


def varied_factors(runs_params: list[dict[str, str]]) -> list[str]:
    """Factor params whose value differs between the runs (sorted), else the default factors."""
    keys = sorted({k for params in runs_params for k in params if k.startswith(FACTOR_PREFIXES)})
    varied = [k for k in keys if len({params.get(k) for params in runs_params}) > 1]
    return varied[:MAX_FACTOR_COLUMNS] or list(DEFAULT_FACTORS)


def seeded(runs_params: list[dict[str, str]]) -> bool:
    """Whether some variant of a sweep ran under more than one seed (run.variant, seed_everything)."""
    seeds: dict[str, set] = {}
    for params in runs_params:
        if params.get("run.variant"):
            seeds.setdefault(params["run.variant"], set()).add(params.get("seed_everything"))
    return any(len(s) > 1 for s in seeds.values())


def mark_training_experiment(client, experiment_id: str) -> None:
    """Tag the experiment as model training and (re)write SinkLab's view where missing or its factors changed."""
    tags = client.get_experiment(experiment_id).tags
    if tags.get(EXPERIMENT_KIND_TAG) != TRAINING_KIND:
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)
    runs = client.search_runs([experiment_id], filter_string=f"tags.`{TAG_KIND}` IS NULL", max_results=1000)
    runs_params = [dict(run.data.params) for run in runs]
    state = json.dumps(view_state(varied_factors(runs_params), seeded(runs_params)))
    try:
        current = json.loads(tags.get(VIEW_TAG, "{}")).get("state")
    except (ValueError, AttributeError):
        current = None
    if current != state:
        envelope = {"name": VIEW_NAME, "createdAt": int(time.time() * 1000), "state": state}
        client.set_experiment_tag(experiment_id, VIEW_TAG, json.dumps(envelope))


def dataset_name(manifest) -> str:
    """A packed dataset as the UI names it, e.g. ``Pile-CC+Github · C2048 · 3f2a9c1e`` (domains, context, hash)."""
    domains = sorted((manifest.splits.get("train") or next(iter(manifest.splits.values()))).domains)
    shown = "+".join(domains[:3]) + (f"+{len(domains) - 3} more" if len(domains) > 3 else "")
    return f"{shown or 'tokens'} · C{manifest.context_length} · {manifest.hash[:8]}"


# ---- links --------------------------------------------------------------------------------------
def ui_base(tracking_uri: str) -> str:
    """Where the UI of this tracking store is: the server itself, else `make ui`'s address."""
    if tracking_uri.startswith(("http://", "https://")):
        return tracking_uri.rstrip("/")
    return "http://127.0.0.1:5000"


def home_url(tracking_uri: str) -> str:
    """The UI's home page, on training runs (not the GenAI pages)."""
    return f"{ui_base(tracking_uri)}/#/?workflowType={WORKFLOW_TYPE}"


def experiment_url(tracking_uri: str, experiment_id: str, shared_view: bool = True) -> str:
    """The experiment's training runs in the chart view, in SinkLab's layout where ``shared_view``."""
    url = (
        f"{ui_base(tracking_uri)}/#/experiments/{experiment_id}/runs?workflowType={WORKFLOW_TYPE}&compareRunsMode=CHART"
    )
    return url + (f"&viewStateShareKey={SHARED_VIEW_KEY}" if shared_view else "")


def run_experiment_url(tracking_uri: str, run_id: str) -> str:
    """The chart view of the run's experiment (the UI's home where the store cannot be asked)."""
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri)
        experiment_id = client.get_run(run_id).info.experiment_id
        marked = VIEW_TAG in client.get_experiment(experiment_id).tags
        return experiment_url(tracking_uri, experiment_id, marked)
    except Exception:  # noqa: BLE001
        return home_url(tracking_uri)
