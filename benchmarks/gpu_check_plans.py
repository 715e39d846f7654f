"""gpu-check's plans (a named list of cases for one GPU window) and the 1B grid, planned with a memory model
(docs/gpu.md)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpu_check_cases import PROFILE_SECONDS, Case, fit_case, gpu_cases, shipped_stage, zero

GIB = 2**30
CONTEXT = 2048
# The 1B run of the H200 window: micro-batch 8, no activation checkpointing, ZeRO-2, compiled, 41.8 GiB peak.
MEASURED_MICRO_BATCH, MEASURED_PEAK_GIB = 8, 41.8
DEVICE_GIB = 141.0  # an H200's memory
HEADROOM = 0.9  # of it a cell may plan to use (the allocator's fragmentation, the CUDA context)
STATE_BYTES = 16  # a parameter's bytes: bf16 weight 2, fp32 master 4, AdamW moments 8, bf16 gradient 2
GRID_SECONDS = 180  # the whole grid, within the plan's budget
GRID_STEPS, GRID_MIN_BATCH = 8, 32  # each cell's optimizer steps; sequences a step at least
FIRST_CELL, NEXT_CELL = 83, 55  # seconds: 1b run's time + 10% (compiles cold); later cells, an estimate


def parameters_1b() -> float:
    from pipeline.flops import matmul_params_per_token
    from pipeline.model import ModelConfig

    cfg = ModelConfig(preset="llama-1b")
    blocks, head = matmul_params_per_token(cfg)
    return blocks + head + cfg.d_model * cfg.vocab_size  # the input embedding too


def predicted_peak_gib(micro_batch: int, checkpointing: bool, params: float | None = None) -> float:
    """Optimizer state (STATE_BYTES a parameter; one GPU: ZeRO partitions nothing) + activations, per sequence
    calibrated on the measured run; with checkpointing each block keeps its fp32 input and one block recomputes."""
    from pipeline.model import ModelConfig

    cfg = ModelConfig(preset="llama-1b")
    state = STATE_BYTES * (params or parameters_1b()) / GIB
    per_sequence = (MEASURED_PEAK_GIB - state) / MEASURED_MICRO_BATCH
    if checkpointing:
        per_sequence = cfg.n_layers * CONTEXT * cfg.d_model * 4 / GIB + per_sequence / cfg.n_layers
    return state + micro_batch * per_sequence


@dataclass(frozen=True)
class Cell:
    micro_batch: int
    checkpointing: bool
    stage: int

    @property
    def name(self) -> str:
        return f"1b-mb{self.micro_batch}{'-ac' if self.checkpointing else ''}-z{self.stage}"


def grid(micro_batches=(8, 16, 32, 64), stages=(1, 2)) -> tuple[list[tuple[Cell, float]], list[tuple[Cell, float]]]:
    """(cells that fit, cells pruned), each with its predicted peak GiB. The order is the one they run in: per
    stage (the cheaper first), the largest micro-batch without checkpointing, the largest with, the measured
    micro-batch without, then the rest, larger first."""
    params, keep, pruned = parameters_1b(), [], []
    for stage in stages:
        fits = []
        for checkpointing in (False, True):
            for mb in micro_batches:
                peak = predicted_peak_gib(mb, checkpointing, params)
                (fits if peak <= HEADROOM * DEVICE_GIB else pruned).append((Cell(mb, checkpointing, stage), peak))
        largest = {ac: max((c.micro_batch for c, _ in fits if c.checkpointing == ac), default=0) for ac in (0, 1)}

        def rank(cell_peak):
            c = cell_peak[0]
            first = [(largest[0], False), (largest[1], True), (MEASURED_MICRO_BATCH, False)]
            key = (c.micro_batch, c.checkpointing)
            return (first.index(key), 0) if key in first else (len(first), -c.micro_batch)

        keep += sorted(fits, key=rank)
    return keep, pruned


def cells_within(seconds: float = GRID_SECONDS) -> int:
    """How many cells the grid's time holds at their minimums."""
    return 0 if seconds < FIRST_CELL else 1 + int((seconds - FIRST_CELL) // NEXT_CELL)


def grid_cases() -> list[Case]:
    cases = []
    for i, (cell, _) in enumerate(grid()[0]):
        batch = max(cell.micro_batch, GRID_MIN_BATCH) * CONTEXT
        args = (
            *("--data.global_batch_tokens", str(batch), "--data.micro_batch_size", str(cell.micro_batch)),
            *("--model.activation_checkpointing", str(cell.checkpointing).lower(), "--trainer.devices", "1"),
            *zero(cell.stage),
        )
        minimum = FIRST_CELL if i == 0 else NEXT_CELL
        cases.append(
            fit_case(cell.name, "paper-1b", "c2048", GRID_STEPS, *args, log_every=2, window=2, minimum=minimum)
        )
    return cases


@dataclass(frozen=True)
class Plan:
    required: tuple[str, ...]  # in order; "1b-grid" stands for the grid's cells
    profile: tuple[str, ...]
    extra: tuple[str, ...] = ()  # run after, while time is left


def causes() -> Plan:
    """The cases that answer the missed goals; the stage the recipe does not ship is measured only if time is left."""
    shipped = shipped_stage()
    other = "60m-zero2" if shipped == "zero1" else "60m-zero1"
    return Plan(
        ("60m-shipped", "60m-zero2-serial", "60m-compiled", "small-softmax", "small-sigmoid", "1b-grid"),
        ("small-softmax", "small-sigmoid"),
        ("small-sink-logit", other),
    )


PLANS = {"causes": causes}
PREPARATION_SECONDS = 6  # both datasets on the H200


def plan_cases(name: str) -> tuple[list[Case], list[Case], list[Case], Plan]:
    """(required cases before the grid, the grid's cells, those after it), the profiled ones' minimums raised."""
    plan, every = PLANS[name](), {c.name: c for c in gpu_cases()}
    raised = {n: replace(every[n], minimum=every[n].minimum + PROFILE_SECONDS) for n in plan.profile}
    pick = [raised.get(n, every[n]) for n in plan.required if n != "1b-grid"]
    split = plan.required.index("1b-grid")
    return pick[:split], grid_cases(), pick[split:] + [every[n] for n in plan.extra], plan


def dry_run(name: str, budget: float) -> str:
    """The plan's cases, their minimums and the total against ``budget``."""
    before, _, after, plan = plan_cases(name)
    required = [c for c in after if c.name in plan.required]
    lines = [f"plan {name}: budget {budget:.0f} s", f"  {'data preparation':<24} {PREPARATION_SECONDS:>4} s"]
    for c in before + required:
        lines.append(f"  {c.name:<24} {c.minimum:>4.0f} s{'  (profiled)' if c.name in plan.profile else ''}")
    lines.append(
        f"  {'1b-grid':<24} {GRID_SECONDS:>4} s  (cells in this order while its time lasts, about the first "
        f"{cells_within()} at their minimums of {FIRST_CELL} s, then {NEXT_CELL} s:)"
    )
    kept, pruned = grid()
    lines += [f"    {cell.name:<22} predicted peak {peak:5.1f} GiB" for cell, peak in kept]
    lines += [
        f"    {c.name:<22} predicted peak {peak:5.1f} GiB: pruned (> {HEADROOM * DEVICE_GIB:.0f})" for c, peak in pruned
    ]
    total = PREPARATION_SECONDS + sum(c.minimum for c in before + required) + GRID_SECONDS
    lines.append(f"  total {total:.0f} s of {budget:.0f} s{'' if total <= budget else ': OVER the budget'}")
    lines += [f"  then, if time is left: {c.name} ({c.minimum:.0f} s)" for c in after if c.name not in plan.required]
    return "\n".join(lines)


def grid_lines(results) -> list[str]:
    """Each grid cell's MFU and peak memory, and the best cell."""
    cells = [r for r in results if r.case.startswith("1b-mb")]
    if not cells:
        return []
    lines = ["1B grid (MFU, peak memory):"]
    for r in cells:
        verdict = "skipped: " + r.skipped if r.skipped else "FAIL " + r.problem if r.problem else "ok"
        mfu = "-" if r.mfu is None else f"{100 * r.mfu:.1f}%"
        peak = "-" if r.peak_gib is None else f"{r.peak_gib:.1f} GiB"
        lines.append(f"  {r.case:<22} {mfu:>6} {peak:>10}  {verdict}")
    done = [r for r in cells if r.mfu is not None and not r.problem]
    best = max(done, key=lambda r: r.mfu) if done else None
    lines.append(f"  best: {best.case} ({100 * best.mfu:.1f}% MFU)" if best else "  best: none (no cell gave an MFU)")
    return lines
