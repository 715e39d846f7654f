"""docs/guides/pretrained.md, run as written with a tiny random Llama (its tokenizer with a BOS) in place
of SmolLM2 and *Hamlet* alone as its natural text: every command runs and prints the tables the guide shows."""

from __future__ import annotations

import json
import shutil

from analysis_helpers import HAMLET
from guide_runner import GuideShell, guide_env, run_guide


def test_pretrained_guide_runs_as_written(tiny_llama_dir, tmp_path):
    model = tmp_path / "tiny-llama"
    shutil.copytree(tiny_llama_dir, model)
    config = model / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "bos_token": "<|endoftext|>"}))
    work = tmp_path / "work"
    work.mkdir()
    env = guide_env(
        tmp_path / "home", tmp_path / "bin", model=str(model), text=str(HAMLET)
    )  # one play: shapes, not values
    shell = GuideShell(work, env)
    try:
        skipped = run_guide("pretrained.md", shell)
    finally:
        shell.close()
    assert [s.command.split()[0] for s in skipped] == ["pip"]
    assert json.loads((work / "analysis" / "smollm2-bos" / "measures.json").read_text())["table1"]
    assert (work / "analysis" / "tiny-llama" / "quant" / "quant_eval.json").exists()
