"""Analysis: sink metrics on probes, pretrained models, streaming perplexity, plots."""
