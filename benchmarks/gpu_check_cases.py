"""The cases of `make gpu-check` in priority order (docs/gpu.md lists them); on the CPU, toy stand-ins."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONTEXT = {"c2048": 2048, "c512": 512, "cpu": 64}
DATA = {key: REPO / "data" / f"embedded-c{context}" for key, context in CONTEXT.items()}


@dataclass(frozen=True)
class Case:
    """kind: fit, preempt, analyze or stream-ppl (of the final checkpoint of case ``reads``), pytest (a test file that
    must pass and skip nothing) or command (a Python script); args: the command's."""

    name: str
    kind: str
    args: tuple[str, ...]
    steps: int = 0
    data: str = "c2048"
    log_every: int = 10
    reads: str = ""
    minimum: float = 0  # seconds it needs (start-up and compilation included); not started with less left
    limit: float | None = None  # seconds until it is killed; None: gpu_check's --timeout


def fit_case(
    name: str,
    recipe: str,
    data: str,
    steps: int,
    *overrides: str,
    kind: str = "fit",
    log_every: int = 10,
    window: int = 10,
    minimum: float = 0,
    limit: float | None = None,
) -> Case:
    settings = {
        "--config": f"configs/recipes/{recipe}.yaml",
        "--trainer.max_steps": str(steps),
        "--trainer.log_every_n_steps": str(log_every),
        "--run.experiment": "gpu-check",
        "--run.name": name,
        "--run.log_model": "false",
        "--run.system_metrics": "false",
        "--run.sink_every": "0",
        "--run.val_every": "0",
        "--run.throughput_window": str(window),
        "--run.checkpoint_every": str(steps // 2 if kind == "preempt" else 0),
        "--optim.warmup_steps": "5",
    }
    common = tuple(word for pair in settings.items() for word in pair)
    return Case(name, kind, common + overrides, steps, data, log_every, minimum=minimum, limit=limit)


def reader(kind: str, reads: str, device: str, *args: str, **fields) -> Case:
    """``sinklab analyze`` or ``stream-ppl`` (the case's name too) of the final checkpoint of case ``reads``."""
    return Case(kind, kind, (*args, "--device", device), reads=reads, **fields)


def zero(stage: int) -> tuple[str, ...]:
    return ("--trainer.strategy.init_args.config", f"configs/deepspeed/zero{stage}.json")


def zero2_without(*settings: str) -> tuple[str, ...]:
    """The shipped zero2.json with ``settings`` of its ``zero_optimization`` turned off, as one JSON argument."""
    config = json.loads((REPO / "configs/deepspeed/zero2.json").read_text())
    config["zero_optimization"].update(dict.fromkeys(settings, False))
    return ("--trainer.strategy.init_args.config", json.dumps(config))


SIGMOID = ("--arch.attention.op", "sigmoid", "--arch.attention.normalizer", "none")
ELU1_KERNEL = ("--arch.attention.op", "kernel", "--arch.attention.feature_map", "elu1")
SOFTPICK = ("--arch.attention.op", "softpick")
EAGER = ("--model.compile", "false")
SINK_LOGIT = ("--arch.attention.sink_logit", "true")


def shipped_stage(recipe: str = "paper-60m") -> str:
    """The ZeRO config file the recipe ships (its strategy's ``init_args.config``), e.g. ``zero1``."""
    import yaml

    strategy = yaml.safe_load((REPO / "configs/recipes" / f"{recipe}.yaml").read_text())["trainer"]["strategy"]
    return Path(strategy["init_args"]["config"]).stem


# Seconds a case needs on an H200 (its time there, start-up and compilation included, plus 10%;
# docs/gpu.md says which are estimates); the as-shipped case takes its stage's.
AS_SHIPPED = {"zero1": 33, "zero2": 52}
PROFILE_SECONDS = 8  # a profiled case's extra: the profiler and the trace's export (an estimate)
TUNING_SECONDS = 15  # the sigmoid case's extra: autotuning the Triton tiles once per shape (an estimate)


def gpu_cases() -> list[Case]:
    onebn = ("--data.global_batch_tokens", "16384", "--trainer.devices", "1")
    small = {"limit": 120}  # minimums: an H200's times (docs/gpu.md) and 10%
    slots, read = "tests/model/test_attention_slots_cuda.py", "60m-compiled"  # read: the analyses' checkpoint

    def p60(name: str, steps: int, *overrides: str, minimum: float, kind: str = "fit", limit: float = 150) -> Case:
        shape = ("--data.global_batch_tokens", "32768", "--data.micro_batch_size", "16", "--trainer.devices", "1")
        return fit_case(name, "paper-60m", "c2048", steps, *shape, *overrides, kind=kind, minimum=minimum, limit=limit)

    return [
        p60("60m-shipped", 40, minimum=AS_SHIPPED.get(shipped_stage(), 52)),
        p60("60m-compiled", 60, "--trainer.strategy", "auto", minimum=45),
        fit_case("small-softmax", "gpu-small", "c512", 60, minimum=37, **small),
        fit_case("small-sigmoid", "gpu-small", "c512", 60, *SIGMOID, minimum=45 + TUNING_SECONDS, **small),
        p60("preempt", 60, kind="preempt", minimum=76, limit=180),
        fit_case("small-sink-logit", "gpu-small", "c512", 60, *SINK_LOGIT, minimum=44, **small),
        fit_case("1b-shipped", "paper-1b", "c2048", 20, *onebn, window=5, minimum=83, limit=240),
        p60("60m-zero2", 60, *zero(2), minimum=52),
        p60("60m-eager", 60, *EAGER, minimum=35),
        p60("60m-zero1", 40, *zero(1), minimum=33),
        p60("60m-zero2-serial", 40, *zero2_without("overlap_comm", "contiguous_gradients"), minimum=37),
        p60("60m-zero3", 40, *zero(3), minimum=52),
        p60("60m-fsdp2", 40, "--trainer.strategy", "fsdp2", minimum=37),
        fit_case("small-elu1-kernel", "gpu-small", "c512", 60, *ELU1_KERNEL, minimum=45, **small),
        fit_case("small-softpick", "gpu-small", "c512", 60, *SOFTPICK, minimum=47, **small),
        reader("analyze", read, "cuda", "-n", "20", "--no-plots", minimum=11),
        reader("stream-ppl", read, "cuda", "--max-tokens", "2048", "--cache", "0+512", "--cache", "4+508", minimum=30),
        Case("slots-cuda", "pytest", (slots, "-q", "-p", "no:cacheprovider", "-rs"), minimum=30, limit=120),
        Case(
            "bench-slots-1b",
            "command",
            ("benchmarks/bench_slots.py", "--cuda-only", "--repeats", "3"),
            minimum=30,
            limit=120,
        ),
    ]


def cpu_cases(context: int = CONTEXT["cpu"]) -> list[Case]:
    """Toy stand-ins on the cpu-tiny recipe, for the harness itself."""
    tiny = ("--trainer.accelerator", "cpu", "--data.global_batch_tokens", str(8 * context))
    two = ("--trainer.devices", "2", "--data.micro_batch_size", "2")
    toy = {"log_every": 2, "window": 2}
    return [
        fit_case("softmax", "cpu-tiny", "cpu", 8, *tiny, **toy),
        fit_case("sigmoid", "cpu-tiny", "cpu", 8, *tiny, *SIGMOID, **toy),
        fit_case("elu1-kernel", "cpu-tiny", "cpu", 8, *tiny, *ELU1_KERNEL, **toy),
        fit_case("softpick", "cpu-tiny", "cpu", 8, *tiny, *SOFTPICK, **toy),
        fit_case("compiled", "cpu-tiny", "cpu", 8, *tiny, "--model.compile", "true", **toy),
        fit_case("zero2", "cpu-tiny", "cpu", 8, *tiny, *two, "--trainer.strategy", "deepspeed_stage_2", **toy),
        fit_case("fsdp2", "cpu-tiny", "cpu", 8, *tiny, *two, "--trainer.strategy", "fsdp2", **toy),
        fit_case("preempt", "cpu-tiny", "cpu", 60, *tiny, kind="preempt", **toy),
        reader("analyze", "softmax", "cpu", "-n", "8", "-T", "12", "--no-plots", data="cpu"),
        reader("stream-ppl", "softmax", "cpu", "--max-tokens", "256", "--cache", "2+30", data="cpu"),
    ]
