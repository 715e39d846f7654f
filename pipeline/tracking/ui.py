"""`sinklab ui`: install SinkLab's chart view on a tracking store's experiments and print their links
(docs/guides/compare.md)."""

from __future__ import annotations

import argparse

from sinklab_io.notices import why

from .contract import TAG_RUN_DIR, experiment_id, prepare_store, tracking_uri
from .views import VIEW_TAG, experiment_url, home_url, mark_training_experiment


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="sinklab ui",
        description="Install SinkLab's chart view (Sink_1, mean alpha_1 and the losses first) on every experiment "
        "of the tracking store that holds SinkLab training runs, and print each one's link. Credentials of a "
        "server with MLflow's basic-auth app come from MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD.",
    )
    parser.add_argument(
        "--tracking-uri", help="the store or server (default: MLFLOW_TRACKING_URI, else ./mlruns/mlflow.db)"
    )
    parser.add_argument(
        "--experiment",
        action="append",
        default=[],
        metavar="NAME",
        help="also this experiment, created where missing (before its first job); repeatable",
    )
    return parser.parse_args(argv)


def install_views(uri: str, named: list[str]) -> list[tuple[str, str, bool]]:
    """(name, id, holds the view) of the named and the training experiments, SinkLab's view written on each."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    ids = [experiment_id(client, name) for name in named]
    for exp in client.search_experiments():
        if exp.experiment_id not in ids and client.search_runs(
            [exp.experiment_id], filter_string=f"tags.`{TAG_RUN_DIR}` IS NOT NULL", max_results=1
        ):
            ids.append(exp.experiment_id)
    shown = []
    for exp_id in ids:
        mark_training_experiment(client, exp_id)
        exp = client.get_experiment(exp_id)
        shown.append((exp.name, exp_id, VIEW_TAG in exp.tags))
    return shown


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(argv or []))
    uri = prepare_store(args.tracking_uri or tracking_uri())
    try:
        shown = install_views(uri, args.experiment)
    except Exception as error:  # noqa: BLE001 - refused credentials, an unreachable server, a bad URI
        raise SystemExit(f"sinklab ui: {uri}: {why(error)}") from None
    print(f"SinkLab's chart view on {len(shown)} experiment{'s' * (len(shown) != 1)} of {uri}")
    print(f"  home: {home_url(uri)}")
    for name, exp_id, marked in shown:
        print(f"  {name}: {experiment_url(uri, exp_id, marked)}")
    return 0
