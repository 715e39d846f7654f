"""Data preparation: read, tokenize and pack corpora into memory-mapped shards with a manifest (docs/data_prep.md)."""
