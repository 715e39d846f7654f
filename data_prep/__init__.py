"""Data preparation: read corpora, tokenize, pack into memory-mapped shards with a manifest.

readers (Pile JSON lines, text, HF datasets) -> chunks (domain filter, counts) -> runner (worker
processes, order, budget, resume) -> pack (tokenize, [BOS] tokens EOS, cut into C, write) ->
manifest (probe set, checksums, hash). `dataset` reads the result (docs/contracts.md section 1);
`embedded` builds the corpus that ships with installed packages; `cli` is `sinklab prep`.
"""
