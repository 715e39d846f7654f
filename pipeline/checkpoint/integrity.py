"""What makes a checkpoint fit to keep (``nonfinite_state``) and to resume from (``checkpoint_problem``)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from pipeline.model import local_part


class NonFiniteLossError(RuntimeError):
    """The training loss, the weights or the optimizer state became NaN or infinite."""


def _optimizer_tensors(optimizer) -> Iterable[torch.Tensor]:
    inner = getattr(optimizer, "optimizer", optimizer)  # DeepSpeed's ZeRO wrapper holds the torch one
    for group in inner.param_groups:
        yield from group["params"]  # under ZeRO: the fp32 master partitions
    for state in inner.state.values():
        yield from (v for v in state.values() if isinstance(v, torch.Tensor) and v.is_floating_point())


def nonfinite_state(module: torch.nn.Module, optimizers: list) -> bool:
    """Whether any weight, master weight or optimizer moment this process holds is NaN or infinite."""
    tensors = [local_part(p).detach() for p in module.parameters()]
    for optimizer in optimizers:
        tensors += [local_part(t).detach() for t in _optimizer_tensors(optimizer)]
    flags = [torch.isfinite(t).all() for t in tensors if t.numel()]
    return bool(flags) and not bool(torch.stack(flags).all())  # one host sync


def _load(path: Path) -> tuple[object, str | None]:
    """Load the archive's index and structure memory-mapped, not its tensors: a file cut short loses its index."""
    try:
        return torch.load(path, map_location="cpu", mmap=True, weights_only=False), None
    except Exception as exc:  # a damaged archive raises zip, pickle or EOF errors alike
        return None, f"{path.name} cannot be read ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"


def _deepspeed_problem(path: Path) -> str | None:
    tag = (path / "latest").read_text().strip()
    tag_dir = path / tag
    if not tag_dir.is_dir():
        return f"its 'latest' file names '{tag}', which is not there"
    world, names = None, []
    for f in sorted(tag_dir.glob("*.pt")):
        blob, problem = _load(f)
        if problem:
            return problem
        names.append(f.name)
        if f.name.endswith("model_states.pt"):
            world = blob.get("dp_world_size", 1)
    if world is None:
        return f"{tag}/ holds no model_states.pt"
    expected = [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(world)]
    if missing := [e for e in expected if not any(n.endswith(e) for n in names)]:
        return f"written by {world} ranks but {', '.join(missing)} is missing"
    return None


def checkpoint_problem(path: Path) -> str | None:
    """What is wrong with a step checkpoint (a file, or a DeepSpeed directory), or None."""
    path = Path(path)
    if path.is_dir():
        if not (path / "latest").is_file():
            return "a DeepSpeed directory without its 'latest' file (written only partly)"
        return _deepspeed_problem(path)
    if not path.is_file():
        return "not there"
    blob, problem = _load(path)
    if problem is None and not (isinstance(blob, dict) and "state_dict" in blob):
        problem = "not a Lightning checkpoint (no state_dict)"
    return problem
