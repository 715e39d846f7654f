"""Data-prep throughput beside raw tokenizer throughput, measured side by side in one run.

The last line is `ratio=<prep tokens/s / raw tokens/s>` for the 10x corpus (docs/data_prep.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import zstandard
from side_by_side import arguments

from data_prep.embedded import shakespeare_documents, stdlib_documents
from data_prep.tokenizer import train_bpe

RAW_SNIPPET = r"""
import json, os, sys, time, glob
from tokenizers import Tokenizer
from data_prep.readers import read_pile
tok = Tokenizer.from_file(sys.argv[1])
batch_chars = int(sys.argv[3])
batches, batch, chars = [], [], 0
for f in sorted(glob.glob(os.path.join(sys.argv[2], "*.jsonl.zst"))):
    for d in read_pile(f):
        batch.append(d.text); chars += len(d.text)
        if chars >= batch_chars:
            batches.append(batch); batch, chars = [], 0
batches.append(batch)
out = {}
for name in ("encode_batch_fast", "encode_batch"):
    encode = getattr(tok, name)
    start = time.perf_counter()
    tokens = sum(len(e.ids) for b in batches for e in encode(b, add_special_tokens=False))
    out[name] = tokens / (time.perf_counter() - start)
print(json.dumps(out))
"""

PREP_SNIPPET = r"""
import json, sys
from data_prep.prepare import PrepConfig, prepare
inputs, out, tokenizer, workers, chunk = sys.argv[1:6]
cfg = PrepConfig(inputs=[inputs], out=out, tokenizer=tokenizer, context_length=128, val_fraction=0.01,
                 workers=int(workers), chunk_chars=int(chunk), progress=False, probe_sequences=100)
r = prepare(cfg)
text_tokens = sum(s["document_tokens"] - 2 * s["documents"] for s in r.manifest["splits"].values())
print(json.dumps({"seconds": r.elapsed_s, "text_tokens": text_tokens}))
"""


def run_sampled(cmd: list[str], env: dict[str, str]) -> tuple[dict, int]:
    """Run `cmd`, sampling the RSS of its whole process tree; (its JSON output, peak bytes)."""
    proc = psutil.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        try:
            peak = max(peak, sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]))
        except psutil.Error:
            pass  # a process of the tree ended while sampled
        time.sleep(0.02)
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"bench_data: {cmd[2][:40]!r}... failed:\n{stderr}")
    return json.loads(stdout.strip().splitlines()[-1]), peak


def write_corpus(texts: list[tuple[str, str]], directory: Path, copies: int) -> None:
    directory.mkdir(parents=True)
    with open(directory / "00.jsonl.zst", "wb") as fh, zstandard.ZstdCompressor(level=3).stream_writer(fh) as writer:
        for domain, text in texts * copies:
            writer.write((json.dumps({"text": text, "meta": {"pile_set_name": domain}}) + "\n").encode())


def main() -> None:
    parser = arguments(__doc__, workers=len(os.sched_getaffinity(0)))
    parser.add_argument(
        "--chunk-chars", type=int, default=1 << 18, help="prep unit of work, also the raw batch size (default 256Ki)"
    )
    args = parser.parse_args()
    texts = [("Shakespeare", t) for _, t in shakespeare_documents(1_500_000)]
    texts += [("Python-stdlib", t) for _, t in stdlib_documents(1_500_000)]
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.workers), TOKENIZERS_PARALLELISM="true")
    with tempfile.TemporaryDirectory(prefix="bench_data_") as tmp:
        tmp = Path(tmp)
        tokenizer = tmp / "tokenizer.json"
        train_bpe((t for _, t in texts), 4096).save(str(tokenizer))
        print(
            f"workers={args.workers} chunk_chars={args.chunk_chars} cpu_count={os.cpu_count()} load1={os.getloadavg()[0]:.1f}"
        )
        print("raw fast = encode_batch_fast, raw = encode_batch; ratio = prep / the faster raw (prep/raw in brackets)")
        print(
            f"{'size':>5} {'tokens':>12} {'raw fast tok/s':>15} {'raw tok/s':>12} {'prep tok/s':>12} {'ratio':>13} {'prep peak RSS':>14}"
        )
        ratio, peaks = 0.0, []
        for copies in (1, 10):
            corpus = tmp / f"corpus{copies}"
            write_corpus(texts, corpus, copies)
            raw, _ = run_sampled(
                [sys.executable, "-c", RAW_SNIPPET, str(tokenizer), str(corpus), str(args.chunk_chars)], env
            )
            prep_args = (corpus / "*.jsonl.zst", tmp / f"out{copies}", tokenizer, args.workers, args.chunk_chars)
            prep, peak = run_sampled([sys.executable, "-c", PREP_SNIPPET, *map(str, prep_args)], env)
            fast, slow = raw["encode_batch_fast"], raw["encode_batch"]
            prep_rate = prep["text_tokens"] / prep["seconds"]
            ratio = prep_rate / max(fast, slow)
            peaks.append(peak)
            both = f"{ratio:.2f} ({prep_rate / slow:.2f})"
            print(
                f"{copies:>4}x {prep['text_tokens']:>12,} {fast:>15,.0f} {slow:>12,.0f} {prep_rate:>12,.0f} {both:>13} {peak / 2**20:>11,.0f} MiB"
            )
        print(f"peak RSS {peaks[-1] / peaks[0]:.2f}x from the smallest to the largest corpus")
        print(f"ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
