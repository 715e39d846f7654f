"""The model an analysis command works on: a SinkLab checkpoint, an HF model or an MLflow run's logged model."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.analysis.hf_capture import ensure_registered, hf_sink_measures
from pipeline.analysis.inputs import ProbeSettings
from pipeline.model.hf_sources import hf_directory, hub_name
from pipeline.model.loading import exported_config
from pipeline.probe import run_probe
from pipeline.sink_measures import SinkMeasures
from sinklab_io.outputs import NotOurs, claim, write_output

MODEL_HELP = "smollm2 | gemma3-270m | .gguf file | HF model dir or hub id | SinkLab checkpoint or export | runs:/<id>"


def add_model_arguments(parser: argparse.ArgumentParser, many: bool = False, logged: bool = False) -> None:
    """MODEL (``many``: MODEL ...) and ``--kind``; with ``logged``, ``--device``, ``--mlflow-uri``, ``--experiment``."""
    if many:
        parser.add_argument("models", nargs="+", metavar="MODEL", help=MODEL_HELP)
    else:
        parser.add_argument("model", help=MODEL_HELP)
    parser.add_argument(
        "--kind", choices=("auto", "hf", "sinklab"), default="auto", help="how to load a model (auto: by its shape)"
    )
    if not logged:
        return
    parser.add_argument("--device", default="auto", help="cpu, cuda or cuda:N (auto: the GPU when one is visible)")
    parser.add_argument("--mlflow-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI; none: no run)")
    parser.add_argument("--experiment", default="sinklab-analysis", help="MLflow experiment of runs of their own")


class Subject:
    """The model under analysis with the few operations the analysis needs."""

    def __init__(
        self, spec: str, kind: str, tokenizer: Path | None = None, command: str = "analyze", device: str = "cpu"
    ) -> None:
        self.spec, self.command = spec, command
        self.trigger_ids: list[int] | None = None  # a Bigram-Backcopy dataset's (--dataset): the active/dormant split
        self.run_id = None  # set for runs:/<run_id> and models:/<model_id>: results go back to that run
        if str(spec).startswith(("runs:/", "models:/")):  # an MLflow run's logged model, downloaded
            from pipeline.tracking import RunModelError, resolve_model

            try:
                resolved = resolve_model(spec)
            except RunModelError as e:
                raise SystemExit(f"sinklab {command}: {e}") from None
            spec, kind = str(resolved.path), "sinklab"
            self.run_id, self.tracking_uri = resolved.run_id, resolved.tracking_uri
            tokenizer = tokenizer or resolved.tokenizer
        self.kind = kind if kind != "auto" else self._detect(spec)
        self.tokenizer = None
        if self.kind == "sinklab":
            from pipeline.model import load_pretrained

            try:
                self.model = load_pretrained(spec)
            except (ValueError, OSError) as error:  # a damaged file, a folder that holds no model
                raise SystemExit(
                    f"sinklab {command}: {error}; give a SinkLab checkpoint (.ckpt), export directory, "
                    ".gguf file or HF model directory"
                ) from None
            self.vocab_size = self.model.config.vocab_size
            self.source, self.path = self.spec, Path(spec)  # path: the local copy of a run's model
            inside, beside = Path(spec) / "tokenizer.json", Path(spec).with_name("tokenizer.json")
            beside = inside if inside.is_file() else beside
            if tokenizer is not None or beside.exists():
                from data_prep.errors import DataPrepError
                from data_prep.tokenizer import load_tokenizer

                try:  # a SinkLab dataset's tokenizer.json, with its BOS/EOS/PAD roles
                    self.tokenizer = load_tokenizer(str(tokenizer or beside)).as_transformers()
                except DataPrepError as e:
                    raise SystemExit(f"sinklab {command}: --tokenizer: {e}") from None
        else:  # a shortcut, a .gguf file, an HF model directory or a hub name, in fp32
            from transformers import AutoModelForCausalLM, AutoTokenizer

            ensure_registered()
            try:
                self.source, directory = hf_directory(spec)
                self.model = AutoModelForCausalLM.from_pretrained(
                    str(directory), dtype=torch.float32, attn_implementation="eager"
                )
                self.tokenizer = AutoTokenizer.from_pretrained(str(directory))
            except OSError as error:  # a hub id that is neither cached nor reachable (or HF_HUB_OFFLINE=1)
                offline = " (HF_HUB_OFFLINE is set)" if os.environ.get("HF_HUB_OFFLINE") else ""
                raise SystemExit(
                    f"sinklab {command}: {spec}: cannot load it{offline}: {str(error).splitlines()[0]}"
                ) from None
            self.vocab_size = min(len(self.tokenizer), self.model.config.get_text_config().vocab_size)
        self.special_ids: set[int] = set(self.tokenizer.all_special_ids) if self.tokenizer is not None else set()
        self.model.eval().to(device_of(device, command))

    def _detect(self, spec: str) -> str:
        path = Path(spec)
        # the hub is asked only for shortcuts and ORG/NAME ids; any other missing path fails at once
        hub_id = hub_name(spec)
        if not path.exists() and not hub_id:
            raise SystemExit(
                f"sinklab {self.command}: {spec}: no such file or directory (a checkpoint, .gguf file or "
                "HF model directory; or smollm2, gemma3-270m or a hub id ORG/NAME)"
            )
        try:
            if path.is_dir() and exported_config(path) is not None:  # a remote-code export: SinkLab's own model
                return "sinklab"
        except ValueError as error:  # a newer format, a config this SinkLab cannot build
            raise SystemExit(f"sinklab {self.command}: {error}") from None
        if path.suffix == ".gguf" or (path.is_dir() and (path / "config.json").exists()) or not path.exists():
            return "hf"
        return "sinklab"

    def header(self, out: Path | None = None) -> dict:
        """The fields every analysis JSON starts with."""
        head = {"model": model_name(self.spec), "source": self.source, "kind": self.kind}
        return head if out is None else head | {"out": str(out)}

    def max_positions(self) -> int | None:
        """The longest sequence the model was built for, when its config states one."""
        if self.kind == "sinklab":
            return self.model.config.max_seq_len
        return getattr(self.model.config.get_text_config(), "max_position_embeddings", None)

    def check_seq_len(self, seq_len: int) -> None:
        limit = self.max_positions()
        if limit is not None and seq_len > limit:
            raise SystemExit(
                f"sinklab {self.command}: -T {seq_len}: {self.spec} handles at most {limit} positions "
                f"(max_seq_len / max_position_embeddings); use -T {limit} or less"
            )

    def require_tokenizer(self):
        if self.tokenizer is None:
            raise SystemExit(
                f"sinklab {self.command}: {self.spec}: no tokenizer.json beside it; "
                "pass --tokenizer <dataset>/tokenizer.json"
            )
        return self.tokenizer

    def measure(self, tokens: torch.Tensor, probe: ProbeSettings) -> SinkMeasures:
        at = {"eps": probe.eps, "positions": probe.positions, "batch_size": probe.batch_size}
        if self.kind == "sinklab":
            return run_probe(self.model, tokens, **at, output_qkv=True, trigger_ids=self.trigger_ids)
        return hf_sink_measures(self.model, tokens, **at)


def device_of(name: str, command: str) -> torch.device:
    """``--device``: auto is the GPU when one is visible, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"sinklab {command}: --device {name}: no CUDA device is visible (use --device cpu)")
    return torch.device(name)


def writer(command: str, specs: list[str]) -> str:
    """Who wrote a command's files, as the output marker records it: the command and its models (paths resolved)."""
    return f"{command} of " + ", ".join(str(Path(s).resolve()) if Path(s).exists() else s for s in specs)


def model_name(spec: str) -> str:
    """A name safe in file and metric names: a path's stem, else the spec itself."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", Path(spec).stem if Path(spec).exists() else spec)


@dataclass(frozen=True)
class Destination:
    """Where a command of many models writes and logs (``options``: as parsed, written into ``<stem>.json``)."""

    models: list[str]
    out: Path | None
    options: dict
    mlflow_uri: str | None
    experiment: str


def save_results(out: Path, stem: str, table: str, options: dict, results: dict, by: str, figure) -> None:
    """``<stem>.md`` (the table, also printed), ``<stem>.json`` (each result's ``to_json()``) and ``<stem>.png``
    (``figure(results, path, by)``) in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_output(out / f"{stem}.md", table + "\n", by)
    entry = {"settings": options | {"out": str(out)}, "models": {name: r.to_json() for name, r in results.items()}}
    write_output(out / f"{stem}.json", json.dumps(entry, indent=2, default=str), by)
    figure(results, out / f"{stem}.png", by)
    print(table)


def log_back(subject, key: str, metrics: dict, settings: dict, out: Path | None) -> str:
    """Results back on the subject's training run (tag ``sinklab.<key>.settings``, files under ``<key>/``); its id."""
    from pipeline.tracking import log_results

    return log_results(subject.tracking_uri, subject.run_id, metrics, {f"sinklab.{key}.settings": settings}, out, key)


def log_results_of(subjects: dict, key: str, results: dict, settings_for, out: Path, d: Destination) -> None:
    """Each model's results (their ``metrics()``) on its MLflow run (:func:`log_back`), else on a run of its own where a
    tracking URI is set."""
    from pipeline.tracking import log_new_run

    uri = d.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI")
    for name, result in results.items():
        subject, metrics, settings = subjects[name], result.metrics(), settings_for(result)
        if subject.run_id is not None:
            run_id = log_back(subject, key, metrics, settings, out)
        elif uri:
            tags = {"sinklab.kind": subject.command, "sinklab.model": name}
            run_id = log_new_run(uri, d.experiment, f"{subject.command}-{name}", tags, settings, metrics, out)
        else:
            continue
        if run_id:
            print(f"{name}: logged to MLflow run {run_id}", file=sys.stderr)


def write_json(entry: dict, path: Path, by: str) -> None:
    write_output(path, json.dumps(entry, indent=2), by)


def csv_text(rows: list[dict]) -> str:
    """``rows`` as CSV with a header, None as an empty cell."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows([{k: "" if v is None else v for k, v in row.items()} for row in rows])
    return buffer.getvalue()


def claimed(out: Path, outputs, command: str, specs: list[str]) -> str:
    """The writer (:func:`writer`) that claimed ``out`` for ``outputs``; refused: SystemExit ``<command>: <why>``."""
    by = writer(command, specs)
    try:
        claim(out, outputs, by=by)
    except NotOurs as error:
        raise SystemExit(f"{command}: {error}") from None
    return by


def claim_out(models: list[str], out: Path | None, command: str, folder: str, outputs) -> tuple[list[str], Path, str]:
    """The models' names, the --out folder (default analysis/<folder>/<first name>), claimed, and its writer."""
    names = [model_name(m) for m in models]
    if twice := [n for n in names if names.count(n) > 1]:
        raise SystemExit(f"{command}: two models share the name {twice[0]!r}; copy one aside")
    out = out or Path("analysis") / folder / names[0]
    return names, out, claimed(out, outputs, command, models)
