"""Data preparation: read corpora, tokenize, pack into memory-mapped shards with a manifest."""
