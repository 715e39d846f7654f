"""benchmarks/gpu_check_plans.py: the GPU window's plan within its budget, the 1B grid planned with the
memory model, and the kinds of case the plan adds (a test file, a script); no training."""

from __future__ import annotations

import re

import pytest
import yaml
from fit_runs import REPO


def test_the_causes_plan_lists_its_cases_and_minimums_within_420_s(load_benchmark):
    gpu_check = load_benchmark("gpu_check")
    text = gpu_check.dry_run("causes", gpu_check.PLAN_BUDGET)
    rows = dict(re.findall(r"^  (\S[\w -]*?)\s+(\d+) s", text, re.M))
    rows.pop("total")
    assert list(rows) == [
        "data preparation",
        "60m-shipped",
        "60m-zero2-serial",
        "60m-compiled",
        "small-softmax",
        "small-sigmoid",
        "1b-grid",
    ]
    total = int(re.search(r"total (\d+) s of 420 s\n", text).group(1))
    assert total == sum(map(int, rows.values())) <= 420 and "OVER" not in text
    assert "small-softmax              45 s  (profiled)" in text and "1b-grid                   180 s" in text
    stage = yaml.safe_load((REPO / "configs/recipes/paper-60m.yaml").read_text())["trainer"]["strategy"]
    shipped = int(re.search(r"zero(\d)\.json", stage["init_args"]["config"]).group(1))
    assert f"then, if time is left: 60m-zero{3 - shipped} (" in text  # the stage the recipe does not ship
    assert "60m-shipped                33 s" in text if shipped == 1 else "60m-shipped                52 s" in text


def test_dry_run_needs_a_plan_and_a_plan_runs_only_on_a_gpu(load_benchmark, capsys):
    gpu_check = load_benchmark("gpu_check")
    for argv, message in (
        (["--dry-run"], "--dry-run: lists a plan's cases; give --plan (causes)"),
        (["--plan", "causes", "--device", "cpu"], "--plan causes: runs its own cases on a GPU"),
    ):
        with pytest.raises(SystemExit):
            gpu_check.main(argv)
        assert message in capsys.readouterr().err


def test_the_memory_model_reproduces_the_measured_run_and_prunes_what_cannot_fit(load_benchmark):
    plans = load_benchmark("gpu_check_plans")
    assert plans.predicted_peak_gib(8, False) == pytest.approx(41.8)
    assert 1.2e9 < plans.parameters_1b() < 1.3e9  # TinyLlama's shape, untied embeddings
    for mb in (8, 16, 32, 64):
        assert plans.predicted_peak_gib(mb, True) < plans.predicted_peak_gib(mb, False)
    kept, pruned = plans.grid()
    limit = plans.HEADROOM * plans.DEVICE_GIB
    assert kept and pruned and all(p <= limit for _, p in kept) and all(p > limit for _, p in pruned)
    assert {c.name for c, _ in pruned} == {"1b-mb64-z1", "1b-mb64-z2"}
    names = [c.name for c, _ in kept]
    assert names[:3] == ["1b-mb32-z1", "1b-mb64-ac-z1", "1b-mb8-z1"] and names.index("1b-mb32-z2") == 7
    cells = plans.grid_cases()
    assert [c.minimum for c in cells[:2]] == [plans.FIRST_CELL, plans.NEXT_CELL] and plans.cells_within() == 2
    assert all(c.steps == plans.GRID_STEPS and "configs/recipes/paper-1b.yaml" in c.args for c in cells)


def test_the_grid_lines_give_each_cell_and_the_best(load_benchmark):
    plans, report = load_benchmark("gpu_check_plans"), load_benchmark("gpu_check_report")
    R = report.Result
    results = [
        R("1b-mb32-z1", None, 70, mfu=0.49, peak_gib=108.0),
        R("1b-mb64-ac-z1", "exit 1: torch.OutOfMemoryError: CUDA out of memory", 40),
        R("1b-mb8-z1", None, 0, skipped="30 s left, needs 55 s"),
    ]
    lines = plans.grid_lines(results)
    assert lines[1].split() == ["1b-mb32-z1", "49.0%", "108.0", "GiB", "ok"]
    assert "FAIL exit 1: torch.OutOfMemoryError" in lines[2] and "skipped: 30 s left" in lines[3]
    assert lines[-1] == "  best: 1b-mb32-z1 (49.0% MFU)"


def test_a_test_file_case_fails_on_a_skip_and_a_script_case_on_its_exit(tmp_path, load_benchmark):
    gpu_check = load_benchmark("gpu_check")
    tests = tmp_path / "test_some.py"
    tests.write_text("import pytest\ndef test_a(): pass\n@pytest.mark.skip(reason='no GPU here')\ndef test_b(): pass\n")
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint('ValueError: no CUDA')\nsys.exit(3)\n")
    cases = [
        gpu_check.Case("skips", "pytest", (str(tests), "-q", "-p", "no:cacheprovider", "-rs")),
        gpu_check.Case("passes", "pytest", (str(tests), "-q", "-p", "no:cacheprovider", "-k", "test_a")),
        gpu_check.Case("script", "command", (str(script),)),
    ]
    matrix = gpu_check.Matrix(cases, tmp_path, {}, [], timeout=60)
    problems = {c.name: matrix.run(c, 60).problem for c in cases}
    assert problems["skips"].startswith("SKIPPED [1] ") and problems["skips"].endswith("no GPU here")
    assert problems["passes"] is None
    assert problems["script"] == "exit 3: ValueError: no CUDA"
