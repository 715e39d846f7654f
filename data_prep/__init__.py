"""Data preparation: read corpora, tokenize, pack into memory-mapped shards with a manifest (docs/data_prep.md).

`dataset` reads the result (docs/contracts.md section 1); `cli` is `sinklab prep`.
"""
