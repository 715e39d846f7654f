"""``sinklab export-hf``: any SinkLab model as a Hugging Face model directory, with its model card.

The command around ``pipeline.model.hf_export``: it resolves the model and gathers what the card reports.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from data_prep.errors import DataPrepError
from sinklab_io.third_party import quiet_third_party


def _check_tokenizer(tokenizer, file: Path, vocab_size: int, trained: str | None) -> None:
    """Refuse a tokenizer that is not the model's: another sha256 than `sinklab fit` recorded, or too many ids."""
    if trained and tokenizer.sha256 != trained:
        ours = f"sha256 {tokenizer.sha256[:12]}, {tokenizer.vocab_size} ids"
        what = f"not the model's ({ours}; the model's: sha256 {trained[:12]}, vocabulary {vocab_size})"
    elif tokenizer.vocab_size > vocab_size:
        what = f"holds {tokenizer.vocab_size} ids, more than the model's vocabulary of {vocab_size}"
    else:
        return
    raise ValueError(f"tokenizer {file}: {what}; give the tokenizer.json of the dataset it was trained on")


def export(args: argparse.Namespace) -> None:
    from data_prep.tokenizer import load_tokenizer
    from pipeline.analysis.inputs import trained_tokenizer
    from pipeline.model import load_pretrained
    from pipeline.model.hf_export import KIND, export_hf
    from pipeline.tracking import CARD_METRICS, MetricsFile, final_metrics, is_model_uri, resolve_model
    from sinklab_io.outputs import claim_directory

    claim_directory(args.out, KIND)  # before a run is downloaded or a model loaded
    facts: dict[str, Any] = {"source": args.checkpoint}
    tokenizer = Path(args.tokenizer) if args.tokenizer else None
    if is_model_uri(args.checkpoint):  # the run's logged model, downloaded
        resolved = resolve_model(args.checkpoint)
        path, tokenizer = resolved.path, tokenizer or resolved.tokenizer
        facts |= {"metrics": final_metrics(resolved), "metrics_from": f"the MLflow run {resolved.run_id}"}
    else:
        path = Path(args.checkpoint)
        beside = ([path / "tokenizer.json"] if path.is_dir() else []) + [path.with_name("tokenizer.json")]
        tokenizer = tokenizer or next((f for f in beside if f.is_file()), None)
        here = path.resolve() if path.is_dir() else path.resolve().parent
        # the card's metrics from the run directory that holds the checkpoint (up to 2 levels above it), if any
        root = next((d for d in [here, *here.parents][:3] if (d / "metrics.jsonl").is_file()), None)
        last = MetricsFile(root).last(list(CARD_METRICS.values())) if root else dict.fromkeys(CARD_METRICS.values())
        facts["metrics"] = {label: last[key] for label, key in CARD_METRICS.items()}
        if root:
            facts["metrics_from"] = str(root / "metrics.jsonl")
    dataset = (path if path.is_dir() else path.parent) / "dataset.json"
    if dataset.is_file():
        facts["dataset"] = json.loads(dataset.read_text())
    model = load_pretrained(path, config=args.config)
    hf_tokenizer = None
    if tokenizer is not None:  # checked before anything is written
        loaded = load_tokenizer(str(tokenizer))
        _check_tokenizer(loaded, tokenizer, model.config.vocab_size, trained_tokenizer(Path(path)))
        hf_tokenizer = loaded.as_transformers()
    kind = export_hf(model, args.out, getattr(torch, args.dtype), hf_tokenizer, facts)
    print(f"wrote {args.out} ({kind}, {model.num_parameters() / 1e6:.2f}M parameters, {args.dtype})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sinklab export-hf", description=__doc__.splitlines()[0])
    parser.add_argument(
        "checkpoint", help="SinkLab export dir, Lightning .ckpt, consolidated state dict, or runs:/<id> / models:/<id>"
    )
    parser.add_argument("--out", required=True, help="output directory (HF save_pretrained layout, with README.md)")
    parser.add_argument("--config", help="model/run config, needed for a bare state-dict file")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--tokenizer", help="tokenizer.json to save beside the weights (default: the one beside them)")
    args = parser.parse_args(argv)
    quiet_third_party()
    try:
        export(args)
    except (ValueError, OSError, DataPrepError) as err:  # a config, a checkpoint, a run, NotOurs, a full disk
        print(f"sinklab export-hf: {str(err).splitlines()[0] if str(err) else type(err).__name__}", file=sys.stderr)
        return 2
    return 0
