"""`sinklab` console command: a dispatcher to each part's own entry point, imported only when used."""

from __future__ import annotations

import importlib
import sys

from sinklab_io.third_party import quiet_third_party

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "prep": ("data_prep.cli", "tokenize and pack a corpus into a training dataset"),
    "fit": ("pipeline.train.cli", "train a model (LightningCLI; --config YAML)"),
    "consolidate": ("pipeline.train.consolidate", "turn a DeepSpeed ZeRO checkpoint into one fp32 state dict"),
    "export-hf": ("pipeline.export", "export any SinkLab model as a Hugging Face model directory"),
    "analyze": ("pipeline.analysis.analyze", "sink metrics and plots for a checkpoint or a pretrained HF model"),
    "survey": (
        "pipeline.analysis.survey",
        "Sink_1 by input, BOS and threshold, norm ratio and dormant heads across models",
    ),
    "stream-ppl": ("pipeline.analysis.stream_ppl", "streaming perplexity with x initial + y recent cached tokens"),
    "passkey": ("pipeline.analysis.passkey", "passkey retrieval by depth under x initial + y recent cached tokens"),
    "length-eval": (
        "pipeline.analysis.length",
        "loss by position past the training length and passkey at 1-8x it, full and streaming, across models",
    ),
    "kv-eval": (
        "pipeline.analysis.kv_eval",
        "perplexity under each registered KV-cache eviction policy, sinks kept or dropped (--help lists them)",
    ),
    "quant-eval": ("pipeline.analysis.quant_eval", "perplexity under simulated W8A8, with the sink kept intact or not"),
    "ui": ("pipeline.tracking.ui", "install SinkLab's chart view on a tracking store's experiments, print their links"),
    "submit": ("cluster.submit", "render and submit a SLURM job for a training config"),
    "sweep": ("pipeline.experiments.sweep", "run or submit every variant of a paper experiment"),
    "report": (
        "pipeline.experiments.report",
        "the paper's table beside the measured values, from MLflow or a data file",
    ),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: sinklab <command> [args...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "Run `sinklab <command> --help` for the options of one command."]
    return "\n".join(lines)


def _shortcut_tokenizer(args: list[str]) -> list[str]:
    """``prep --tokenizer smollm2`` (a pretrained model's shortcut): its converted directory's tokenizer."""
    for i, arg in enumerate(args):
        if arg.startswith("--tokenizer="):
            value, span = arg.split("=", 1)[1], 1
        elif arg == "--tokenizer" and i + 1 < len(args):
            value, span = args[i + 1], 2
        else:
            continue
        from pipeline.model.hf_sources import SHORTCUTS, hf_directory

        if value in SHORTCUTS:
            return args[:i] + ["--tokenizer", hf_directory(value)[1]] + args[i + span :]
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"sinklab: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    quiet_third_party()
    if name == "prep":
        rest = _shortcut_tokenizer(rest)
    module = importlib.import_module(SUBCOMMANDS[name][0])
    try:
        result = module.main(rest)
    except SystemExit as refusal:
        if not isinstance(refusal.code, str):
            raise
        # a refused input ("sinklab <command>: <what; what would be right>") exits 2, as argparse's do
        print(refusal.code, file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
